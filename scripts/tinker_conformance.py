"""The conformance table of docs/tinker.md: every public method of the Tinker SDK's four clients, by introspection.

    python scripts/tinker_conformance.py            print the table
    python scripts/tinker_conformance.py --write    write it into docs/tinker.md (between the conformance markers)

Each method (with its ``_async`` twin) is ``served`` (a route of wai serve answers it), ``refused by name`` (a 4xx
that names the feature and why, or the SDK's own error where it sends nothing) or ``client-side`` (the SDK
answers it without a request). ``CALLS`` says which, how, and the test that holds it;
tests/service/test_tinker_conformance.py fails when the installed SDK has a method ``CALLS`` does not list.
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

CLASSES = ("RestClient", "ServiceClient", "TrainingClient", "SamplingClient")
START, END = "<!-- conformance:start -->", "<!-- conformance:end -->"
DOC = Path(__file__).resolve().parents[1] / "docs" / "tinker.md"
STATUSES = ("served", "refused by name", "client-side")
T = "tests/service/"
REST, FIELD, SAMPLING = f"{T}test_tinker_rest.py::", f"{T}test_tinker_field.py::", f"{T}test_tinker_sampling.py::"
SDK, FIDELITY, CONF = f"{T}test_tinker_sdk.py::", f"{T}test_tinker_fidelity.py::", f"{T}test_tinker_conformance.py::"
RUNS = f"{REST}test_runs_sessions_and_checkpoints_with_sizes_ttls_and_deletion"
REFUSED = f"{REST}test_features_wai_serve_cannot_offer_are_refused_by_name"
EXTERNAL = f"{REST}test_external_weights_are_files_behind_expiring_signed_urls"
SNAPSHOT = f"{SDK}test_a_sampling_client_is_a_snapshot_whose_logprobs_equal_compute_logprobs"
STATE = f"{SDK}test_save_and_load_state_with_and_without_the_optimizer"
CLIENTS = f"{CONF}test_the_client_side_calls_and_handles_work_against_wai_serve"

# "Class.method" (or "*.method" for every class that has it): (status, route or note, test)
CALLS: dict[str, tuple[str, str, str]] = {
    "RestClient.assign_session_project": ("refused by name", "`PUT sessions/{id}/project`: no projects", REFUSED),
    "*.copy_weights": ("refused by name", "`copy_weights`: no projects to copy between", REFUSED),
    "RestClient.delete_checkpoint": ("served", "`DELETE training_runs/{id}/checkpoints/{kind}/{name}`", RUNS),
    "RestClient.delete_checkpoint_from_tinker_path": ("served", "the same route; the files are deleted", RUNS),
    "RestClient.export_session_trace": ("refused by name", "`GET sessions/{id}/trace_export`: runs list their "
                                        "operations instead", REFUSED),
    "RestClient.get_audit_log": ("refused by name", "`GET audit`: no audit log", REFUSED),
    "RestClient.get_billing_usage": ("refused by name", "`GET billing/usage/events`: nothing is billed", REFUSED),
    "RestClient.get_current_checkpoint_storage_usage": ("served", "`GET billing/usage/checkpoints/current`: the "
                                                        "bytes on disk of this key's checkpoints", RUNS),
    "RestClient.get_external_weights_urls": ("served", "`GET .../external_weights/{name}/external_weights_urls`: "
                                             "HMAC-signed URLs, one hour", EXTERNAL),
    "RestClient.get_sampler": ("served", "`GET samplers/{id}`", CLIENTS),
    "*.get_server_capabilities": ("served", "`GET get_server_capabilities`: the `--model` list", CLIENTS),
    "RestClient.get_session": ("served", "`GET sessions/{id}`: its runs and samplers", RUNS),
    "*.get_telemetry": ("client-side", "the SDK's own telemetry object; its `POST telemetry` is read within the "
                        "body limit and dropped", f"{FIELD}test_every_tinker_route_reads_its_body_within_the_limit"),
    "RestClient.get_training_run": ("served", "`GET training_runs/{id}`",
                                    f"{FIDELITY}test_the_rest_client_reads_a_training_run_by_its_tinker_path"),
    "RestClient.get_training_run_by_tinker_path": ("served", "`GET training_runs/{id}`",
                                                   f"{FIDELITY}test_the_rest_client_reads_a_training_run_by_its_"
                                                   "tinker_path"),
    "RestClient.get_weights_info_by_tinker_path": ("served", "`POST weights_info`", RUNS),
    "RestClient.list_checkpoints": ("served", "`GET training_runs/{id}/checkpoints`: states (size on disk), sampler "
                                    "weights, external weights, TTLs", RUNS),
    "RestClient.list_sessions": ("served", "`GET sessions`", RUNS),
    "RestClient.list_training_runs": ("served", "`GET training_runs`", RUNS),
    "RestClient.list_user_checkpoints": ("served", "`GET checkpoints`", RUNS),
    "RestClient.publish_checkpoint_from_tinker_path": ("refused by name", "`POST .../publish`: no hub", REFUSED),
    "RestClient.search_sessions": ("served", "`POST sessions/search`: id, display name, metadata, status",
                                   f"{REST}test_finishing_a_session_is_first_wins_with_its_reason_checked"),
    "RestClient.set_checkpoint_ttl_from_tinker_path": ("served", "`PUT .../ttl`: deleted at the first request "
                                                       "after it expires",
                                                       f"{REST}test_a_checkpoint_whose_ttl_passed_is_deleted"),
    "RestClient.unpublish_checkpoint_from_tinker_path": ("refused by name", "`DELETE .../publish`: no hub", REFUSED),
    "RestClient.whoami": ("refused by name", "the SDK sends nothing: it reads JWT claims, and wai serve's "
                          "`client/config` turns JWT auth off (the SDK says so)", CLIENTS),
    "ServiceClient.close": ("served", "`POST sessions/{id}/finish`: first reason wins, checked",
                            f"{REST}test_finishing_a_session_is_first_wins_with_its_reason_checked"),
    "ServiceClient.create_custom_loss": ("client-side", "traced and run on the client (`client/config`: "
                                         "`custom_loss_server_side` false)", f"{CONF}test_a_custom_loss_runs_on_the_"
                                         "client_and_equals_cross_entropy"),
    "ServiceClient.create_lora_training_client": ("served", "`create_model`",
                                                  f"{SDK}test_supervised_steps_lower_the_loss_and_equal_the_engine_"
                                                  "in_process"),
    "ServiceClient.create_rest_client": ("client-side", "a RestClient on the same server", RUNS),
    "*.create_sampling_client": ("served", "`create_sampling_session`, `asample`", SNAPSHOT),
    "ServiceClient.create_training_client_from_state": ("served", "`load_weights` (a new run)", STATE),
    "ServiceClient.create_training_client_from_state_with_optimizer": ("served", "`load_weights` (a new run)", STATE),
    "*.get_console_url": ("client-side", "a Tinker Cloud console link; no request", CLIENTS),
    "ServiceClient.holder": ("client-side", "the SDK's connection holder (an attribute)", CLIENTS),
    "TrainingClient.forward": ("served", "`forward_backward` (protobuf)",
                               f"{FIDELITY}test_cross_entropy_without_weights_counts_every_position"),
    "TrainingClient.forward_backward": ("served", "`forward_backward` (protobuf), every engine loss",
                                        f"{SDK}test_importance_sampling_ppo_and_cispo_losses_follow_their_formulas"),
    "TrainingClient.forward_backward_custom": ("served", "`forward_backward`; the loss runs on the client",
                                               f"{CONF}test_a_custom_loss_runs_on_the_client_and_equals_cross_"
                                               "entropy"),
    "TrainingClient.get_info": ("served", "`get_info`; `lora_rank` None for a full fine-tune",
                                f"{FIELD}test_a_full_fine_tune_reports_lora_rank_none"),
    "*.get_tokenizer": ("served", "`get_info`'s tokenizer location, loaded on the client", CLIENTS),
    "TrainingClient.load_state": ("served", "`load_weights`", STATE),
    "TrainingClient.load_state_with_optimizer": ("served", "`load_weights`", STATE),
    "TrainingClient.optim_step": ("served", "`optim_step`",
                                  f"{SDK}test_supervised_steps_lower_the_loss_and_equal_the_engine_in_process"),
    "TrainingClient.save_state": ("served", "`save_weights`", STATE),
    "TrainingClient.save_weights_and_get_sampling_client": ("served", "`save_weights_for_sampler`", SNAPSHOT),
    "TrainingClient.save_weights_external": ("served", "`save_weights_external`: files under `--data-dir`; "
                                             "encryption refused by name", EXTERNAL),
    "TrainingClient.save_weights_for_sampler": ("served", "`save_weights_for_sampler`",
                                                f"{SAMPLING}test_sampling_by_model_path_or_base_model_needs_no_"
                                                "sampling_session"),
    "SamplingClient.compute_logprobs": ("served", "`asample` (prompt scoring, `prompt_logprobs_last_n`; a prompt "
                                        "may fill the context)",
                                        f"{FIELD}test_compute_logprobs_takes_a_sequence_the_length_of_the_context"),
    "SamplingClient.create": ("served", "`create_sampling_session`", CLIENTS),
    "SamplingClient.from_sampler_handle": ("served", "a clone: `join_sampling_session`", CLIENTS),
    "SamplingClient.get_base_model": ("client-side", "known since creation", CLIENTS),
    "SamplingClient.get_sampler_handle": ("client-side", "the client's state as a string", CLIENTS),
    "SamplingClient.on_queue_state_change": ("client-side", "the SDK's queue-state callback", CLIENTS),
    "SamplingClient.sample": ("served", "`asample` with every 0.38 field, `retrieve_futures`",
                              f"{SAMPLING}test_prompt_logprobs_last_n_targets_and_alternative_draws_agree_with_"
                              "prompt_logprobs"),
}


def methods() -> dict[str, list[str]]:
    """Each client's public methods (and attributes), ``_async`` twins folded into their method."""
    import tinker

    found: dict[str, list[str]] = {}
    for name in CLASSES:
        members = [m for m, _ in inspect.getmembers(getattr(tinker, name)) if not m.startswith("_")]
        found[name] = sorted({m.removesuffix("_async") for m in members})
    return found


def entry(cls: str, method: str) -> tuple[str, str, str] | None:
    return CALLS.get(f"{cls}.{method}") or CALLS.get(f"*.{method}")


def missing() -> list[str]:
    return [f"{cls}.{m}" for cls, names in methods().items() for m in names if entry(cls, m) is None]


def render() -> str:
    import tinker

    lines = [f"Generated by `scripts/tinker_conformance.py` from `tinker` {tinker.__version__} (every public method of "
             f"{', '.join(CLASSES)}; `_async` twins included).", "",
             "| SDK call | status | route / how | test |", "|---|---|---|---|"]
    for cls, names in methods().items():
        for m in names:
            status, how, test = entry(cls, m) or ("NOT LISTED", "", "")
            lines.append(f"| `{cls}.{m}` | {status} | {how} | `{test.removeprefix(T)}` |")
    return "\n".join(lines)


def write(doc: Path = DOC) -> None:
    text = doc.read_text()
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    doc.write_text(f"{head}{START}\n{render()}\n{END}{tail}")


if __name__ == "__main__":
    if missing():
        sys.exit(f"the SDK has methods CALLS does not list: {', '.join(missing())}")
    if "--write" in sys.argv:
        write()
    else:
        print(render())
