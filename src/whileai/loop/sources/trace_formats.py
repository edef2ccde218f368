"""The three shapes a line of a rows / traces file may take, each read into the library's trace form.

    whileai  the library's rows: ``prompt_tokens`` and ``tokens`` (ids), ``behavior_logprobs``, optional
             ``action_mask``, ``reward``, ``task_id``, ``truncated``, ``model``, ``sampling``
    openai   one logged exchange with an OpenAI-compatible server such as vLLM: ``{"request": {...},
             "response": {...}, "reward": r, "task_id": ...}``. Chat completions (``logprobs.content[j] =
             {token, logprob}``) and completions (``logprobs.tokens`` + ``logprobs.token_logprobs``). Token
             ids come from vLLM's ``token_ids`` / ``prompt_token_ids`` (``return_token_ids``) or from tokens
             written ``token_id:N`` (``--return-tokens-as-token-ids``). One trace per choice. The request's
             ``temperature`` / ``top_p`` / ``top_k`` are the trace's sampling settings.
    text     ``prompt`` (text or chat messages) and ``completion`` (text), with ``behavior_logprobs`` (or
             ``token_logprobs``), one per completion token. The completion is tokenized with the model's
             tokenizer; when the log has one entry more, the last is the EOS token the server stopped on.
             Any other count is refused with both counts: the log-probabilities would sit on wrong tokens.

A trace is a dict: ``prompt_tokens``, ``tokens`` and, where the line has them, ``behavior_logprobs``,
``action_mask``, ``reward``, ``task_id``, ``truncated``, ``model``, ``pair``, ``chosen``, ``sampling``. A bad
line raises ``BatchError`` naming the file and line, the field, what is wrong and the fix.

``sampling`` (any format; in an OpenAI log the request's settings stand in when the line has none; read for
an RL method only) is the distribution the trace was sampled from, which its behavior log-probabilities are
probabilities of, and so the one the trainer scores it under: ``{"temperature": 0.7, "top_p": 0.9, "top_k": 20}``. A setting left out
or null is the method's (its temperature; no top-p, no top-k); ``top_k`` -1 reads as 0 (off).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard, cast

from whileai.errors import BatchError
from whileai.loop.step import SCORED  # the sampling settings a trace is scored under
from whileai.loop.types import Tokenizer
from whileai.prompts import text_ids
from whileai.rows.io import check_label, check_reward, check_truncated

FORMATS = {"whileai": "the library's rows (token ids)", "openai": "an OpenAI-compatible server's log (vLLM)",
           "text": "text rows (prompt and completion as text), tokenized with the model's tokenizer"}
# Fields each format reads at the top of a line; any other key is reported once in the run's log.
PER_TOKEN = ("ref_logprobs", "teacher_logprobs", "values")  # given on a line, they reach the method as they are
COMMON = ("action_mask", "reward", "task_id", "truncated", "model", "pair", "chosen", "sampling", *PER_TOKEN)
READ = {"whileai": ("prompt_tokens", "tokens", "behavior_logprobs", "logprobs", *COMMON),
        "openai": ("request", "response", "prompt_token_ids", *COMMON),
        "text": ("prompt", "completion", "behavior_logprobs", "token_logprobs", "logprobs", *COMMON)}
LABELS = ("task_id", "model", "pair")
TOKEN_ID = "token_id:"  # vLLM's --return-tokens-as-token-ids form of a token
# Other settings that change the distribution a token is drawn from, at their neutral values: the trainer
# cannot score under them, so a trace must have been sampled with them neutral (or not set).
NEUTRAL = {"min_p": 0, "frequency_penalty": 0, "presence_penalty": 0, "repetition_penalty": 1, "logit_bias": {}}
PASSIVE = ("max_tokens", "max_completion_tokens", "stop", "seed", "n")  # settings that change no distribution


class NoTokenIds(BatchError):
    """An OpenAI log line whose completion is text, not token ids: a scan says it once for the whole file."""


TEXT_ROUTE = ("Fix: start vLLM with --return-tokens-as-token-ids (tokens then read 'token_id:N') or request "
              "return_token_ids, and train on the traces logged after; or write each exchange as a text row "
              "({\"prompt\", \"completion\", \"behavior_logprobs\"}: the model's tokenizer reads the completion, and "
              "the count of log-probabilities is checked against it; docs/traces.md)")


@dataclass(frozen=True)
class Vocab:
    """What reading a line needs from the model: its tokenizer and the number of token ids it has."""

    tokenizer: Tokenizer
    size: int
    context: int = 2**31
    """the model's context (max_position_embeddings): a trace must fit in it"""


def detect(row: Mapping[str, Any]) -> str | None:
    """The format a parsed line is written in, or None when it is none of the three."""
    if "response" in row or "choices" in row:
        return "openai"
    if "prompt_tokens" in row:
        return "whileai"
    if "completion" in row or "prompt" in row:
        return "text"
    return "whileai" if "tokens" in row else None


def read_line(fmt: str, where: str, row: Mapping[str, Any], vocab: Vocab, sampled: bool = True) -> list[dict[str, Any]]:
    """The traces on one line (several for an OpenAI response with n > 1 choices). ``sampled``: read the
    sampling settings too (an RL method scores each trace under them; SFT, DPO and RM do not read them)."""
    traces = _openai(where, row, vocab) if fmt == "openai" else [_text(where, row, vocab) if fmt == "text"
                                                                  else _library(where, row, vocab)]
    stated = _stated_sampling(fmt, where, row) if sampled else {}
    for trace in traces:
        _common(where, row, trace, vocab)
        if stated:
            trace["sampling"] = stated
    return traces


def _stated_sampling(fmt: str, where: str, row: Mapping[str, Any]) -> dict[str, Any]:
    """The line's ``sampling`` field, or else an OpenAI log's request settings ({} when none is stated)."""
    if "sampling" in row:
        return sampling(where, "sampling", row["sampling"])
    if fmt == "openai" and isinstance(row.get("request"), Mapping):
        return sampling(where, "request", row["request"], every_key=False)
    return {}


# ----------------------------------------------------------------------------- the formats
def _library(where: str, row: Mapping[str, Any], vocab: Vocab) -> dict[str, Any]:
    for name in ("prompt_tokens", "tokens"):
        if name not in row:
            raise BatchError(f"{where}: field {name!r} is missing. Fix: give the prompt's token ids as "
                             "'prompt_tokens' and the completion's as 'tokens' (or write the line as text: 'prompt' "
                             "and 'completion').")
    trace: dict[str, Any] = {"prompt_tokens": token_ids(where, "prompt_tokens", row["prompt_tokens"], vocab.size, empty_ok=True),
             "tokens": token_ids(where, "tokens", row["tokens"], vocab.size)}
    if "behavior_logprobs" in row:
        trace["behavior_logprobs"] = logprobs(where, "behavior_logprobs", row["behavior_logprobs"],
                                              len(trace["tokens"]))
    if "logprobs" in row:  # kept aside: the loop scores 'logprobs' itself, so a log's must be the sampler's
        trace["logged_logprobs"] = True
    return trace


def _text(where: str, row: Mapping[str, Any], vocab: Vocab) -> dict[str, Any]:
    from whileai.envs import Task, render_prompt

    for name in ("prompt", "completion"):
        if name not in row:
            raise BatchError(f"{where}: field {name!r} is missing. Fix: a text row needs 'prompt' (text or chat "
                             "messages) and 'completion' (text).")
    if not isinstance(row["completion"], str):
        raise BatchError(f"{where}: field 'completion' is a {type(row['completion']).__name__}; it must be the "
                         "reply as text. Fix: write the completion as a JSON string.")
    given = [n for n in ("behavior_logprobs", "token_logprobs") if n in row]
    if len(given) > 1:
        raise BatchError(f"{where}: both 'behavior_logprobs' and 'token_logprobs' are given. Fix: keep one "
                         "list of the sampler's log-probabilities.")
    task_id = str(row.get("task_id", where))
    try:
        prompt = render_prompt(vocab.tokenizer, Task(task_id, row["prompt"]))
    except Exception as err:  # a tokenizer's own error on a bad prompt: name the line
        raise BatchError(f"{where}: field 'prompt' could not be tokenized ({err}). Fix: give the prompt as text "
                         "or as chat messages [{\"role\": ..., \"content\": ...}].") from None
    completion = [int(i) for i in vocab.tokenizer.encode(row["completion"], add_special_tokens=False)]
    eos = vocab.tokenizer.eos_token_id
    trace: dict[str, Any] = {"prompt_tokens": prompt}
    if not given:  # a demonstration (SFT): the reply ends where the model should stop
        trace["tokens"] = completion + ([int(eos)] if eos is not None else [])
        return trace
    name = given[0]
    values = row[name]
    count = len(values) if isinstance(values, list) else -1
    if count == len(completion) + 1 and eos is not None:
        completion = completion + [int(eos)]  # the server logged the stop token's log-probability too
    if count != len(completion):
        raise BatchError(f"{where}: field {name!r} has {count} log-probabilities but the completion tokenizes to "
                         f"{len(completion)} tokens with this model's tokenizer, so they cannot be matched to "
                         "tokens. Fix: log token ids with the log-probabilities (vLLM: return_token_ids, or "
                         "--return-tokens-as-token-ids) and write the line in the library's or the server's form, "
                         "or tokenize with the tokenizer the server used.")
    trace["tokens"] = completion
    trace["behavior_logprobs"] = logprobs(where, name, values, len(completion))
    return trace


def _openai(where: str, row: Mapping[str, Any], vocab: Vocab) -> list[dict[str, Any]]:
    response = row.get("response", row)
    request = row.get("request", {})
    if not isinstance(response, Mapping) or not isinstance(request, Mapping):
        raise BatchError(f"{where}: 'response' and 'request' must be JSON objects (the server's reply and the "
                         "request body). Fix: log the bodies as they were sent and received.")
    choices = response.get("choices")
    if not isinstance(choices, list) or not choices or not all(isinstance(c, Mapping) for c in choices):
        raise BatchError(f"{where}: field 'response.choices' is {_short(choices)}; it must be a non-empty list of "
                         "choices. Fix: log the server's whole response body.")
    traces = []
    for k, choice in enumerate(choices):
        at = f"{where}, choice {k}" if len(choices) > 1 else where
        tokens, values = _choice_tokens(at, choice, vocab.size)
        trace: dict[str, Any] = {"prompt_tokens": _openai_prompt(at, row, request, response, choice, vocab),
                                 "tokens": tokens}
        if values is not None:
            trace["behavior_logprobs"] = values
        if choice.get("finish_reason") is not None:
            trace["truncated"] = choice.get("finish_reason") == "length"
        if isinstance(response.get("model"), str):
            trace["model"] = response["model"]
        traces.append(trace)
    return traces


def _choice_tokens(where: str, choice: Mapping[str, Any], size: int) -> tuple[list[int], list[float] | None]:
    """A choice's completion token ids and, when logged, one log-probability per token."""
    block = choice.get("logprobs")
    entries: list[Any] | None = None
    values: list[Any] | None = None
    if isinstance(block, Mapping) and isinstance(block.get("content"), list):  # chat completions
        entries = [e.get("token") if isinstance(e, Mapping) else e for e in block["content"]]
        values = [e.get("logprob") if isinstance(e, Mapping) else None for e in block["content"]]
        field = "logprobs.content[].logprob"
    elif isinstance(block, Mapping) and isinstance(block.get("tokens"), list):  # completions
        entries, values, field = block["tokens"], block.get("token_logprobs"), "logprobs.token_logprobs"
    if "token_ids" in choice:
        ids = token_ids(where, "choices[].token_ids", choice["token_ids"], size)
    elif entries is not None:
        ids = token_ids(where, "logprobs tokens", [_token_id(where, j, e) for j, e in enumerate(entries)], size)
    else:
        raise NoTokenIds(f"{where}: the choice has neither 'token_ids' nor logprobs with its tokens. Fix: request "
                         "logprobs (chat: logprobs=true; completions: logprobs=1) from a server started with "
                         "--return-tokens-as-token-ids, or ask vLLM for return_token_ids.")
    if values is None:
        return ids, None
    return ids, logprobs(where, field, values, len(ids))


def _token_id(where: str, j: int, entry: object) -> int:
    if isinstance(entry, str) and entry.startswith(TOKEN_ID) and entry[len(TOKEN_ID):].isdigit():
        return int(entry[len(TOKEN_ID):])
    raise NoTokenIds(f"{where}: logged token {j} is {_short(entry)}, text rather than an id, and text does not map "
                     f"back to token ids reliably. {TEXT_ROUTE}")


def _openai_prompt(where: str, row: Mapping[str, Any], request: Mapping[str, Any], response: Mapping[str, Any],
                   choice: Mapping[str, Any], vocab: Vocab) -> list[int]:
    """The prompt's token ids: logged ids where there are any, else the request's prompt tokenized."""
    for source in (choice, response, row):
        if "prompt_token_ids" in source:
            return token_ids(where, "prompt_token_ids", source["prompt_token_ids"], vocab.size, empty_ok=True)
    prompt = request.get("prompt")
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        return token_ids(where, "request.prompt", prompt, vocab.size, empty_ok=True)
    if isinstance(prompt, str):  # the completions API: raw text, as the server's tokenizer encoded it
        return text_ids(vocab.tokenizer, prompt)
    if isinstance(request.get("messages"), list):
        from whileai.envs import Task, render_prompt

        return render_prompt(vocab.tokenizer, Task(where, list(request["messages"])))
    raise BatchError(f"{where}: no prompt: the line has no 'prompt_token_ids' and its request no 'prompt' or "
                     "'messages'. Fix: log the request body with the response (or vLLM's prompt_token_ids).")


# ----------------------------------------------------------------------------- per-field checks
def _common(where: str, row: Mapping[str, Any], trace: dict[str, Any], vocab: Vocab) -> None:
    """The fields every format reads from the top of the line."""
    if "reward" in row:
        trace["reward"] = check_reward(where, row["reward"])
    for name in LABELS:
        if name in row:
            trace[name] = check_label(where, name, row[name])
    if "truncated" in row:
        trace["truncated"] = check_truncated(where, row["truncated"])
    if "chosen" in row:
        if not isinstance(row["chosen"], bool):
            raise BatchError(f"{where}: field 'chosen' is {_short(row['chosen'])}; it must be true or false (the "
                             "better row of a DPO pair). Fix: write true or false.")
        trace["chosen"] = row["chosen"]
    if "action_mask" in row:
        trace["action_mask"] = action_mask(where, row["action_mask"], len(trace["tokens"]))
    if not trace["prompt_tokens"]:
        raise BatchError(f"{where}: the prompt has no tokens, so the first generated token has no context to be "
                         "scored in. Fix: log the prompt's token ids (they begin with BOS where the model uses one).")
    positions = len(trace["prompt_tokens"]) + len(trace["tokens"]) - 1  # the last token is only predicted
    if positions > vocab.context:
        raise BatchError(f"{where}: {len(trace['prompt_tokens'])} prompt + {len(trace['tokens'])} completion tokens "
                         f"need {positions} positions, past the model's context of {vocab.context}. Fix: leave out "
                         "traces longer than the context, or train a model with a longer one.")
    for name in PER_TOKEN:
        if name in row:
            trace[name] = logprobs(where, name, row[name], len(trace["tokens"]), upper=math.inf if name == "values"
                                   else 0.0)


def token_ids(where: str, name: str, value: object, size: int, empty_ok: bool = False) -> list[int]:
    """A list of token ids, each in [0, size)."""
    if not isinstance(value, list) or not set(map(type, value)) <= {int}:
        raise BatchError(f"{where}: field {name!r} must be a list of integer token ids; got {_short(value)}. Fix: "
                         "log the ids the tokenizer produced (integers), not text.")
    if not value and not empty_ok:
        raise BatchError(f"{where}: field {name!r} is empty; a trace needs at least one generated token. Fix: "
                         "leave out exchanges whose reply was empty.")
    bad = [v for v in value if not 0 <= v < size] if value and (min(value) < 0 or max(value) >= size) else []
    if bad:
        raise BatchError(f"{where}: field {name!r} holds token id {bad[0]}, outside this model's vocabulary of "
                         f"{size} ids (0..{size - 1}). Fix: train the model that wrote the traces (or one with its "
                         "tokenizer); ids from another tokenizer mean other words.")
    return list(value)


def logprobs(where: str, name: str, value: object, n: int, upper: float = 0.0) -> list[float]:
    """One finite log-probability <= 0 per token (``upper=math.inf``: any finite number, e.g. values)."""
    if not isinstance(value, list) or len(value) != n:
        count = len(value) if isinstance(value, list) else _short(value)
        raise BatchError(f"{where}: field {name!r} has {count} entries for {n} tokens. Fix: log one sampler "
                         "log-probability per generated token.")
    if set(map(type, value)) <= {float, int} and math.isfinite(sum(value)) and max(value) <= upper:
        return value if set(map(type, value)) <= {float} else [float(v) for v in value]  # the usual case, fast
    for j, v in enumerate(value):
        if type(v) not in (int, float) or not math.isfinite(v):
            raise BatchError(f"{where}: field {name!r} entry {j} is {v!r}; it must be a finite number. Fix: give "
                             "a number for every token (a NaN or null means it was not recorded: leave such traces "
                             "out, or log it).")
        if v > upper:
            raise BatchError(f"{where}: field {name!r} entry {j} is {v!r}, above 0, which no log-probability can "
                             "be. Fix: log log-probabilities (natural log, <= 0), not probabilities or logits (vLLM: "
                             "--logprobs-mode processed_logprobs or raw_logprobs).")
    return [float(v) for v in value]


def sampling(where: str, name: str, value: object, every_key: bool = True) -> dict[str, Any]:
    """The settings a trace was sampled with, as stated: ``temperature`` (> 0), ``top_p`` (in (0, 1]),
    ``top_k`` (an integer >= 0, or -1 read as 0: off); null or absent is not stated. Any other setting that
    shapes the distribution (``NEUTRAL``) must be at its neutral value. ``every_key``: refuse keys that are
    none of these (a ``sampling`` field; a request body has many others)."""
    if not isinstance(value, Mapping):
        raise BatchError(f"{where}: field {name!r} is {_short(value)}; it must be a JSON object of the settings the "
                         "trace was sampled with. Fix: write e.g. {\"temperature\": 0.7, \"top_p\": 0.9, \"top_k\": "
                         "20}, or leave the field out to score the trace at the method's settings.")
    unknown = sorted(set(value) - set(SCORED) - set(NEUTRAL) - set(PASSIVE)) if every_key else []
    if unknown:
        raise BatchError(f"{where}: field {name!r} has unknown setting(s) {unknown}. Fix: use {list(SCORED)} (and "
                         f"{sorted(NEUTRAL)} only at their neutral values; {list(PASSIVE)} are ignored).")
    for knob, neutral in NEUTRAL.items():
        if value.get(knob) is not None and value[knob] != neutral:
            raise BatchError(f"{where}: field '{name}.{knob}' is {_short(value[knob])}; the trainer scores a trace "
                             "under temperature, top-p and top-k only, so no ratio for a trace sampled with it "
                             f"would be right. Fix: leave such traces out of an RL file, or sample with {knob} "
                             f"{neutral!r}.")
    stated = {k: value[k] for k in SCORED if value.get(k) is not None}
    for knob, v in stated.items():
        if (rule := _SETTING_RULES[knob](v)) is not None:
            raise BatchError(f"{where}: field '{name}.{knob}' is {_short(v)}; {rule}")
    if "top_k" in stated:
        stated["top_k"] = max(int(stated["top_k"]), 0)  # -1 (vLLM's, Tinker's "off") is 0 here
    return {k: float(v) if k != "top_k" else v for k, v in stated.items()}


def _number(v: object) -> TypeGuard[float]:
    return type(v) in (int, float) and math.isfinite(cast(float, v))


def _temperature_rule(v: object) -> str | None:
    if _number(v) and v == 0:
        return ("temperature 0 is greedy: the arg-max has probability 1 and every other token 0, so there is no "
                "distribution to score the trace under and no ratio. Fix: leave greedy traces out of an RL file "
                "(they can train SFT), or sample at a temperature > 0.")
    if not _number(v) or v < 0:
        return ("it must be a finite number > 0, the temperature the trace was sampled at. Fix: log the "
                "request's temperature, or leave it out (null) for the method's.")
    return None


def _top_p_rule(v: object) -> str | None:
    if _number(v) and 0 < v <= 1:
        return None
    return ("it must be a number in (0, 1] (1 = no nucleus truncation). Fix: log the request's top_p, or leave it "
            "out (null) for none.")


def _top_k_rule(v: object) -> str | None:
    if type(v) is int and v >= -1:
        return None
    return ("it must be an integer >= 0 (0 or -1 = no top-k truncation). Fix: log the request's top_k as an "
            "integer, or leave it out (null) for none.")


_SETTING_RULES = {"temperature": _temperature_rule, "top_p": _top_p_rule, "top_k": _top_k_rule}


def action_mask(where: str, value: object, n: int) -> list[bool]:
    """True on the tokens the model wrote, false on the ones a tool or the environment wrote."""
    if not isinstance(value, list) or any(not isinstance(v, bool) and v not in (0, 1) for v in value):
        raise BatchError(f"{where}: field 'action_mask' must be a list of true/false, one per completion token; "
                         f"got {_short(value)}. Fix: write true on tokens the model wrote, false on tool output.")
    if len(value) != n:
        raise BatchError(f"{where}: field 'action_mask' has {len(value)} entries for {n} completion tokens. Fix: "
                         "give one entry per completion token (false where a tool wrote it).")
    if not any(value):
        raise BatchError(f"{where}: field 'action_mask' is false on all {n} tokens: nothing the model wrote is "
                         "left to train on. Fix: mark the model's own tokens true, or leave the trace out.")
    return [bool(v) for v in value]


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
