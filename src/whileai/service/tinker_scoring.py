"""The prompt and sample scores a Tinker ``SampleRequest`` may ask for beyond the engine's own ``sample``.

    topk_sample_logprobs=k     the k most likely tokens at every sampled position, under the sampling distribution
    target_prompt_logprobs     log-probabilities of named token ids at prompt positions ([len(prompt) - 1, K], -1 = none)
    prompt_alt_tokens_k=k      k independent draws at every prompt position after the first, with their log-probs

Each is computed on the run's thread with the weights the sample used (``engine.weights(version)``), from the
engine's own scoring pieces (``whileai.engine.logprobs``): one forward pass over the prompt, the output layer
applied in chunks of positions so a 150k vocabulary never needs a [positions, vocab] tensor at once.
``target_prompt_logprobs`` is scored under the model's own distribution, as ``prompt_logprobs`` is; the draws and
their log-probabilities are under the request's sampling distribution (temperature, top-k, top-p), as sampled
tokens' ``logprobs`` are.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from whileai.engine.logprobs import hidden_states, scoring, select_logprobs, topk_logprobs

ROWS = 64  # prompt positions per chunk when the whole distribution is needed


@contextmanager
def _scoring(engine: Any) -> Iterator[Any]:
    model = engine.model
    was = model.training
    model.eval()
    try:
        with torch.inference_mode(), engine.loaded.precision():
            yield model
    finally:
        model.train(was)


def distribution_of(params: dict[str, Any]) -> Any:
    """The sampling distribution of ``params`` (the model's own for greedy, which has none to draw from)."""
    fields = {k: params[k] for k in ("temperature", "top_k", "top_p") if k in params}
    return scoring(fields) if fields.get("temperature", 1.0) > 0 else scoring(None)


def _prompt_hidden(engine: Any, model: Any, prompt: list[Any]) -> torch.Tensor:
    inputs = torch.tensor(prompt[:-1], dtype=torch.long, device=engine.device)[None]
    return hidden_states(model, inputs)[0]


def target_logprobs(engine: Any, prompt: list[Any], targets: list[list[int]]) -> list[list[float | None]]:
    """``log p(targets[i][j] | prompt[:i + 1])``; None where the target is -1 (nothing asked)."""
    asked = torch.tensor(targets, dtype=torch.long)
    with _scoring(engine) as model:
        hidden = _prompt_hidden(engine, model, prompt)
        values = select_logprobs(model, hidden, asked.clamp(min=0).to(engine.device), chunk_size=engine.logprob_chunk)
    return [[None if a < 0 else float(v) for a, v in zip(row_a, row_v)]
            for row_a, row_v in zip(asked.tolist(), values.float().cpu().tolist())]


def alternative_tokens(engine: Any, prompt: list[Any], k: int, params: dict[str, Any]) -> dict[str, list[list[Any]]]:
    """``k`` draws from the sampling distribution at every prompt position after the first (seeded by
    ``params["seed"]`` when given), and each draw's log-probability there."""
    generator = torch.Generator()
    if params.get("seed") is not None:
        generator.manual_seed(int(params["seed"]))
    else:
        generator.seed()
    distribution = distribution_of(params)
    tokens: list[list[int]] = []
    logprobs: list[list[float]] = []
    with _scoring(engine) as model:
        hidden = _prompt_hidden(engine, model, prompt)
        for start in range(0, hidden.shape[0], ROWS):
            ids, lps = topk_logprobs(model, hidden[start:start + ROWS], engine.vocab_size,
                                     chunk_size=engine.logprob_chunk, distribution=distribution)
            ids, lps = ids.cpu(), lps.float().cpu()
            draws = torch.multinomial(lps.exp(), k, replacement=True, generator=generator)
            tokens += ids.gather(1, draws).tolist()
            logprobs += lps.gather(1, draws).tolist()
    return {"tokens": tokens, "logprobs": logprobs}


def sampled_topk(engine: Any, prompt: list[Any], sequences: list[dict[str, Any]], k: int,
                 params: dict[str, Any]) -> None:
    """Add ``topk_logprobs`` (one row of (token, logprob) pairs per sampled token) to each sequence, under the
    distribution the tokens were sampled from."""
    fields = {key: params[key] for key in ("temperature", "top_k", "top_p") if key in params}
    scored_under = fields if fields.get("temperature", 1.0) > 0 else None
    for seq in sequences:
        if not seq["tokens"]:
            seq["topk_logprobs"] = []
            continue
        rows = engine.compute_logprobs(prompt + seq["tokens"], k, sampling_params=scored_under)["topk"]
        seq["topk_logprobs"] = rows[len(prompt):]
