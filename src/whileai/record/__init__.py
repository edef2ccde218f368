"""Production traces: `wai policy` serves the model being trained over the OpenAI API; `wai record` records
each exchange through it (or any OpenAI-compatible server) as a trace, takes late rewards, and exports the
rows `wai train --rows` trains on. See docs/record.md.
"""
