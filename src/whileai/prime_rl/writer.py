"""``prime_rl_config``: a method object (or name) -> a prime-rl TOML that trains that method, or a refusal.

This module is the one place that maps methods to prime-rl. Each supported method has a small
function (``WRITERS``, keyed by the method's registry name) that turns the method object's knobs into
prime-rl keys, names each knob prime-rl cannot read with the reason (``ignored``), and refuses a knob
value that would make prime-rl train a different method (``refusals.py``). Every default is read
from the method object; prime-rl's own defaults come from the schema table (``schema.py``), which is
also the only source of keys the writer may emit.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from typing import Any

from whileai.endpoints import Endpoint
from whileai.errors import ConfigError
from whileai.methods.base import Method, plural
from whileai.prime_rl import refusals, schema
from whileai.prime_rl.overrides import apply_overrides, finish
from whileai.prime_rl.plan import Context, Plan, PrimeRLConfig, group_size, put
from whileai.prime_rl.schema import PINNED_SHORT

# ----------------------------------------------------------------- knob names -> prime-rl keys
# Fields with these names mean the same thing on every method that has them.
KNOB_KEYS: dict[str, str] = {
    "rollouts_per_prompt": "orchestrator.group_size",
    "temperature": "orchestrator.train.sampling.temperature",
    "max_tokens": "orchestrator.train.sampling.max_completion_tokens",
    "off_policy_steps": "orchestrator.max_off_policy_steps",
    "decay": "orchestrator.algo.decay",
    "lr": "trainer.optim.lr",
    "learning_rate": "trainer.optim.lr",
}

# Knobs the methods gained when whileai.algorithms was folded into them (docs/algorithms.md), at the value
# that leaves the method's arithmetic as it was: what prime-rl runs anyway (another value is not read).
FOLDED: dict[str, tuple[Any, str]] = {
    "loss": ("cross_entropy", "the method's own arithmetic, which prime-rl's algorithm reproduces with its loss"),
    "estimator": ("mean", "prime-rl's max_rl divides by the group mean"),
    "kl_coef": (1.0, "the teacher gap unscaled, as prime-rl's distillation takes it"),
    "length": ("max_tokens", "Dr. GRPO's one constant length, as the method states it"),
}

# Why a knob is not read, shared by several methods.
CLIP = ("prime-rl clips no ratio: its default rl loss masks a token whose probability (not ratio) moved more than "
        "dppo_mask_low/high = 0.2 (prime_rl/trainer/rl/loss.py), and the ipo loss masks |p - mu| > ipo_threshold")
CLIPS = {name: CLIP for name in ("clip", "clip_high", "dual_clip")}  # the PPO clip family: none is read
TRUNCATED = ("no key of the pinned schema masks or zeroes a reply cut at max_completion_tokens (prime_rl/configs/"
             "orchestrator.py): it trains with whatever reward the taskset's reward function gives it")
WEIGHT = ("prime-rl divides each loss component by its own token count over the whole step "
          "(prime_rl/trainer/rl/loss.py): every token of the step weighs the same")
REF_KL_RATIO = ("prime-rl's ref_kl loss multiplies each token's signal by the uncapped ratio pi/mu and drops a token "
                "whose probability fell more than 0.2 below the sampler's (prime_rl/trainer/rl/loss.py ref_kl_loss_fn)")
LAG = ("prime-rl always samples one step ahead of the trainer (TARGET_LAG = 1, prime_rl/orchestrator/"
       "orchestrator.py) and keeps rollouts up to max_off_policy_steps = {steps} policy versions old, with its "
       "{loss} loss as the correction; wrap the method in wai.Async(method, correction='ipo', "
       "off_policy_steps=...) to state the lag and the correction yourself")


# ----------------------------------------------------------------- per-method writers
def _knobs(method: Method, plan: Plan, ignored: Mapping[str, str], same: Mapping[str, str] | None = None) -> None:
    """Route every knob of ``method``: a KNOB_KEYS key, an ignored reason, or 'what prime-rl runs anyway'."""
    label, same = type(method).__name__, same or {}
    for name in type(method).knobs():
        value, tag = getattr(method, name), f"{label}.{name}"
        if name in FOLDED and FOLDED[name][0] == value:
            plan.mapped[tag] = f"{value!r}: {FOLDED[name][1]}"
        elif name in same:
            plan.mapped[tag] = f"{value!r}: {same[name]}"
        elif name in ignored:
            plan.ignored[tag] = f"{value!r}: {ignored[name]}"
        elif name in KNOB_KEYS:
            plan.keys[KNOB_KEYS[name]] = (value, tag)
            plan.mapped[tag] = f"{KNOB_KEYS[name]} = {value!r}"
        else:
            plan.ignored[tag] = f"{value!r}: no key of {PINNED_SHORT} reads it"


def _grouped(method: Any, algo: str, ignored: Mapping[str, str] | None = None,
             same: Mapping[str, str] | None = None, needs_group: bool = True) -> Plan:
    """A group-baseline method on prime-rl's rl component; ``needs_group``: refused at group size 1."""
    plan = Plan(algo={"type": algo}, component="rl")
    _knobs(method, plan, ignored or CLIPS, same)
    if needs_group:
        plan.finalize.append(_needs_a_group)
    if "loss_type" not in type(method).knobs():  # GRPO states its length weight in ignored["loss_type"]
        plan.warnings.append(f"wai.{type(method).__name__} weights trajectory i by 1/(B*T_i); {WEIGHT}.")
    return plan


def _grpo(method: Any, ctx: Context) -> Plan:
    if method.beta > 0:
        raise refusals.knob_value(method, "beta")
    if ctx.strict and method.loss_type in ("grpo", "bnpo"):
        raise refusals.knob_value(method, "loss_type")
    lost = {"grpo": "the division by the group's std and the 1/T_i weight per sequence",
            "bnpo": "the division by the group's std (its pooled 1/N weight is prime-rl's)",
            "dr_grpo": "the constant 1/(B*max_tokens) weight (its no-std advantage is prime-rl's)"}[method.loss_type]
    loss_type = (f"prime-rl's grpo is reward minus group mean with no std (prime_rl/orchestrator/algo/grpo.py) "
                 f"and {WEIGHT[0].lower() + WEIGHT[1:]}; not honoured: {lost}")
    return _grouped(method, "grpo", {**CLIPS, "truncated": TRUNCATED, "loss_type": loss_type},
                    {"beta": "no KL to a reference, which is what prime-rl runs"})


def _rloo(method: Any, ctx: Context) -> Plan:
    plan = _grouped(method, "grpo")
    plan.owned.add("trainer.loss.adv_tau")
    plan.finalize.append(_rloo_scale)
    return plan


def _rloo_scale(config: dict[str, Any], plan: Plan) -> None:
    """RLOO's A_i = R_i - mean of the other k-1 = k/(k-1) (R_i - group mean): grpo with adv_tau = k/(k-1)."""
    k = group_size(config)
    put(config, "trainer.loss.adv_tau", k / (k - 1))
    plan.warnings.append(f"wai.RLOO is written as prime-rl's grpo with trainer.loss.adv_tau = k/(k-1) = {k}/{k - 1}: "
                         "R_i minus the mean of the other k-1 rollouts equals k/(k-1) times R_i minus the group "
                         "mean, exactly, while every group holds k rollouts.")


def _max_rl(method: Any, ctx: Context) -> Plan:
    return _grouped(method, "max_rl")


def _rae(method: Any, ctx: Context) -> Plan:
    plan = _grouped(method, "rae", needs_group=False)
    plan.finalize.append(_rae_baseline)
    if method.baselines:
        plan.warnings.append(f"the running baselines on this wai.RAE object ({plural(len(method.baselines), 'agent')}) do not "
                             "carry over: prime-rl's rae starts every agent at 0 and keeps the baseline in memory "
                             "only (not checkpointed).")
    return plan


def _rae_baseline(config: dict[str, Any], plan: Plan) -> None:
    if group_size(config) == 1:
        decay = schema.get(config, "orchestrator.algo.decay")
        plan.warnings.append(
            f"rae at group_size 1: each rollout's advantage is its reward minus a running average of past rewards "
            f"per agent (an EMA, b <- {decay} b + {1 - decay:.2g} R; prime_rl/orchestrator/algo/rae.py), not a group "
            "mean; on a single-agent taskset this is REINFORCE against that average. The baseline lives in memory "
            "and restarts at 0 when the run resumes.")


def _needs_a_group(config: dict[str, Any], plan: Plan) -> None:
    k = group_size(config)
    if k < 2:
        raise refusals.group_of_one(plan.method, k)


def _opd(method: Any, ctx: Context) -> Plan:
    teacher = method.teacher if method.teacher is not None else ctx.teacher
    if teacher is None:
        raise refusals.opd_without_teacher(method)
    if method.teacher is not None and ctx.teacher is not None and ctx.teacher != method.teacher:
        raise ConfigError(f"prime_rl_config: two teachers: OPD.teacher={method.teacher!r} and teacher="
                          f"{ctx.teacher!r}; pass one of them")
    _check_vocab(teacher, ctx)
    plan = _distill(method, "opd", {}, {})
    plan.teacher_used = ctx.teacher is not None
    if method.teacher is None:  # written with the teacher given to prime_rl_config
        plan.method = method.replace(teacher=teacher)
    plan.algo["teacher"] = _frozen(teacher, "wai.OPD's teacher")
    plan.warnings.append(_serve_it_yourself(teacher, "teacher") + " It must be a vLLM server: prime-rl asks it for "
                         "prompt_logprobs of the policy's tokens.")
    if teacher.vocab_size is not None and ctx.model_vocab_size is None:
        plan.warnings.append(f"the teacher's vocabulary ({teacher.vocab_size}) was not compared with the student's: "
                             "pass model_vocab_size=len(tokenizer) so a tokenizer mismatch is refused.")
    return plan


def _distill(method: Any, algo: str, same: Mapping[str, str], ignored: Mapping[str, str]) -> Plan:
    if method.divergence != "reverse_kl":
        raise refusals.knob_value(method, "divergence")
    plan = Plan(algo={"type": algo}, component="ref_kl")
    top_k = ("prime-rl's teacher scores only the sampled token (ref_logprobs of the policy's own tokens, "
             "prime_rl/trainer/rl/loss.py ref_kl_loss_fn): the top-k form is not available, the sampled-token "
             "form of the same reverse KL is what trains")
    same = {"divergence": "the sampled-token reverse KL, which is prime-rl's fixed ref_kl signal", **same}
    ignored = {"top_k": top_k, **ignored}
    if getattr(method, "max_ratio", 0.0) is None:
        same["max_ratio"] = ("the uncapped ratio pi/mu, by which prime-rl's ref_kl loss multiplies each token's "
                             "signal (prime_rl/trainer/rl/loss.py ref_kl_loss_fn)")
    else:
        ignored["max_ratio"] = f"no key caps the ratio: {REF_KL_RATIO}"
    _knobs(method, plan, ignored, same)
    return plan


OPSD_PRIVILEGED: dict[str, tuple[str, str]] = {
    # privileged -> (demo_key, template); 'demonstration' is prime-rl's own default pair
    "demonstration": ("demonstration", schema.KEYS["orchestrator.algo.template"].default),
    "reference": ("answer", "Here is the reference answer:\n<answer>\n{demonstration}\n</answer>"),
    "hint": ("hint", "Here is a hint:\n<hint>\n{demonstration}\n</hint>"),
}
OPSD_ANCHOR = ("prime-rl's opsd teacher is the live policy shown the privileged text (prime_rl/orchestrator/algo/"
               "opsd.py): no moving-average or frozen copy of the weights exists, so this trains anchor='live'")


def _opsd(method: Any, ctx: Context) -> Plan:
    if method.privileged == "feedback":
        raise refusals.knob_value(method, "privileged")
    demo_key, template = OPSD_PRIVILEGED[method.privileged]
    same = {"privileged": f"orchestrator.algo.demo_key = {demo_key!r}, with its template"}
    if method.anchor == "live":
        same["anchor"] = "the live policy, which is what prime-rl runs"
    plan = _distill(method, "opsd", same, {} if method.anchor == "live" else {"anchor": OPSD_ANCHOR})
    plan.algo.update(demo_key=demo_key, template=template)
    plan.warnings.append(f"prime-rl's opsd prepends info[{demo_key!r}] of each example (else a top-level rollout "
                         "field of that name) to the teacher's context: the taskset must provide it.")
    return plan


def _sft(method: Any, ctx: Context) -> Plan:
    if ctx.teacher is None:
        raise refusals.sft_without_source(method)
    normalize = (f"{WEIGHT}, which is normalize='token_mean'; the learning rate's scale differs from "
                 f"{method.normalize!r}")
    plan = Plan(algo={"type": "sft", "sampling": {"source": _frozen(ctx.teacher, "the frozen sampler")}},
                component="ce", teacher_used=True)
    if method.normalize == "token_mean":
        _knobs(method, plan, {}, {"normalize": "prime-rl's ce component is a token mean over the step"})
    else:
        _knobs(method, plan, {"normalize": normalize})
    plan.warnings.append(_serve_it_yourself(ctx.teacher, "frozen sampler") + " Any OpenAI-compatible server works; "
                         "the student's renderer re-tokenizes its replies.")
    return plan


def _async(method: Any, ctx: Context) -> Plan:
    if method.correction in ("icepop", "tis"):
        raise refusals.knob_value(method, "correction")
    plan = build_plan(method.method, ctx)
    plan.async_wrapped = True
    if plan.method is not method.method:  # an inner OPD that took teacher= from the call
        method = method.replace(method=plan.method)
    plan.method = method
    label = "Async"
    plan.keys["orchestrator.max_off_policy_steps"] = (method.off_policy_steps, f"{label}.off_policy_steps")
    plan.mapped[f"{label}.off_policy_steps"] = f"orchestrator.max_off_policy_steps = {method.off_policy_steps!r}"
    for name in ("ratio", "max_ratio"):
        plan.mapped[f"{label}.{name}"] = f"{getattr(method, name)!r}: unused with correction='ipo'"
    if plan.component == "rl":
        plan.loss = {"type": "ipo", "ipo_threshold": method.threshold}
        plan.keys["trainer.loss.ipo_threshold"] = (method.threshold, f"{label}.threshold")
        plan.mapped[f"{label}.correction"] = "trainer.loss.type = 'ipo'"
        plan.mapped[f"{label}.threshold"] = f"trainer.loss.ipo_threshold = {method.threshold!r}"
    else:
        why = (f"the ipo loss shapes only prime-rl's rl component, and {plan.algo['type']} trains its "
               f"{plan.component} component, whose trust region is fixed (prime_rl/trainer/rl/loss.py)")
        plan.ignored[f"{label}.correction"] = f"'ipo': {why}"
        plan.ignored[f"{label}.threshold"] = f"{method.threshold!r}: {why}"
    return plan


WRITERS: dict[str, Callable[[Any, Context], Plan]] = {
    "grpo": _grpo, "dr_grpo": _grpo, "rloo": _rloo, "max_rl": _max_rl, "rae": _rae,
    "opd": _opd, "opsd": _opsd, "sft": _sft, "async": _async,
}


def build_plan(method: Method, ctx: Context) -> Plan:
    """The plan for one method object, or the refusal that says why prime-rl cannot run it."""
    name = type(method).name
    if name in refusals.WHOLE_METHODS:
        raise refusals.whole_method(name, method)
    if "values" in getattr(method, "requires", {}):
        raise refusals.critic(method)
    writer = WRITERS.get(name)
    if writer is None:
        raise refusals.no_mapping(f"wai.{type(method).__name__}")
    plan = writer(method, ctx)
    plan.method = plan.method or method  # the object written: an OPD given teacher= carries it
    if ctx.strict and plan.ignored:
        tag, why = next(iter(plan.ignored.items()))
        raise refusals.strict(tag, why)
    return plan


# ----------------------------------------------------------------- helpers used by the writers
def _frozen(endpoint: Any, what: str) -> dict[str, Any]:
    """A prime-rl FrozenModelConfig table from a wai.Endpoint."""
    if not getattr(endpoint, "model", ""):
        raise refusals.teacher_without_name(what)
    table = {"name": endpoint.model, "base_url": endpoint.base_url}
    if endpoint.api_key_env:
        table["api_key_var"] = endpoint.api_key_env
    return table


def _serve_it_yourself(endpoint: Any, role: str) -> str:
    return (f"prime-rl's launcher never starts frozen models: serve the {role} {endpoint.model!r} at "
            f"{endpoint.base_url} yourself before launch, on GPUs not given to the run.")


def _check_vocab(teacher: Any, ctx: Context) -> None:
    if teacher.vocab_size is not None and ctx.model_vocab_size is not None and teacher.vocab_size != ctx.model_vocab_size:
        raise refusals.vocab_mismatch(teacher.vocab_size, ctx.model_vocab_size, ctx.model)


# ----------------------------------------------------------------- the entry point
def prime_rl_config(env: str | Mapping[str, Any], method: str | Method, *, model: str, teacher: Any = None,
                    model_vocab_size: int | None = None, strict: bool = False, **overrides: Any) -> PrimeRLConfig:
    """A prime-rl config that trains ``method`` on taskset ``env`` from ``model``, or a refusal (ConfigError).

    ``env`` is a taskset id (``"reverse-text"``) or ``{"id": ..., **taskset fields}``. ``method`` is a
    method object or a registry name. ``teacher`` (a ``wai.Endpoint``) is the frozen model SFT samples
    from, or an OPD teacher when the OPD object has none; ``model_vocab_size`` (the student's
    ``len(tokenizer)``) lets a tokenizer mismatch with the teacher be refused. ``strict=True`` refuses
    instead of listing a knob in ``ignored``. ``overrides`` are dotted prime-rl keys
    (``**{"orchestrator.group_size": 1}``) or the short names in ``overrides.ALIASES``; every one must be in
    the pinned schema.
    """
    if not isinstance(model, str) or not model.strip():
        raise ConfigError(f"prime_rl_config: model={model!r} is invalid: it must be the model id or path to train, "
                          "e.g. model='Qwen/Qwen3-0.6B'")
    method_object = _resolve(method)
    ctx = Context(model=model.strip(), teacher=teacher, model_vocab_size=model_vocab_size, strict=strict)
    if model_vocab_size is not None and (isinstance(model_vocab_size, bool) or not isinstance(model_vocab_size, int)
                                         or model_vocab_size < 1):
        raise ConfigError(f"prime_rl_config: model_vocab_size={model_vocab_size!r} is invalid: it must be None or "
                          "the student tokenizer's len(tokenizer), an integer >= 1")
    if teacher is not None and not isinstance(teacher, Endpoint):
        raise ConfigError(f"prime_rl_config: teacher={teacher!r} is invalid: it must be None or "
                          "wai.Endpoint(base_url='http://host:port/v1', model='<served name>')")
    plan = build_plan(method_object, ctx)
    if teacher is not None and not plan.teacher_used:
        raise ConfigError(f"prime_rl_config: teacher={teacher!r} is read only for wai.SFT (the frozen model it "
                          "samples from) and for a wai.OPD without its own teacher; drop it for this method")
    config = _base(env, ctx, plan)
    apply_overrides(config, overrides, plan)
    for step in plan.finalize:
        step(config, plan)
    finish(config, ctx, plan)
    return PrimeRLConfig(method=_landed(plan.method, config, plan), config=config, ignored=dict(plan.ignored),
                         warnings=list(plan.warnings), mapped=dict(plan.mapped))


def _landed(method: Method, config: dict[str, Any], plan: Plan) -> Method:
    """The method with the values that landed: a knob an override replaced carries the written value.

    A value the knob itself refuses (its own rule is stricter than the prime-rl key's) leaves the object as
    it was; the warning about the replacement still says what was written.
    """
    for path, (_value, tag) in plan.keys.items():
        owner, knob = tag.split(".")
        landed = schema.get(config, path)
        target = method if type(method).__name__ == owner else getattr(method, "method", None)
        if target is None or path not in plan.overridden or type(target).__name__ != owner \
                or getattr(target, knob) == landed:
            continue
        try:
            changed = target.replace(**{knob: landed})
        except ConfigError:
            continue
        method = changed if target is method else method.replace(method=changed)
    return method


def _resolve(method: str | Method) -> Method:
    if isinstance(method, Method):
        return method
    if isinstance(method, str):
        from whileai.methods.registry import method as by_name
        from whileai.methods.registry import method_names

        key = method.strip().lower().replace("-", "_")
        if key not in method_names():
            if key in refusals.WHOLE_METHODS:  # e.g. ppo: no whileai class, still refused with the reason
                raise refusals.whole_method(key, key)
            raise refusals.unknown(method, method_names())
        try:
            return by_name(key)
        except ConfigError as err:  # a name whose defaults are not a method by themselves (async, groupwise_grading)
            if key in refusals.WHOLE_METHODS:
                raise refusals.whole_method(key, key) from None
            raise ConfigError(f"prime_rl_config: method {method!r} cannot be built from its name alone: {err}") \
                from None
    raise ConfigError(f"prime_rl_config: method={method!r} is invalid: it must be a method object such as "
                      "wai.GRPO() or a name such as 'grpo'")


def _base(env: str | Mapping[str, Any], ctx: Context, plan: Plan) -> dict[str, Any]:
    """The config before overrides: shared fields once at the top, the required tables, the method's keys."""
    config: dict[str, Any] = {
        "seq_len": schema.SEQ_LEN_DEFAULT,
        "model": {"name": ctx.model},
        "ckpt": {},
        "trainer": {},
        "orchestrator": {"batch_size": schema.KEYS["orchestrator.batch_size"].default},
        "inference": {},
    }
    for path, (value, _tag) in plan.keys.items():
        put(config, path, value)
    config["orchestrator"]["algo"] = {**plan.algo, **config["orchestrator"].get("algo", {})}
    if plan.loss:
        config["trainer"]["loss"] = dict(plan.loss)
    config["orchestrator"].setdefault("train", {})["source"] = [_source(env, plan)]
    if not plan.async_wrapped:
        plan.finalize.append(_lag_warning)
    return config


def _lag_warning(config: dict[str, Any], plan: Plan) -> None:
    """The lag and correction prime-rl runs for a method not wrapped in Async, as the config states them."""
    loss = "default (DPPO masks)" if plan.component == "rl" else f"fixed {plan.component}"
    steps = schema.get(config, "orchestrator.max_off_policy_steps", schema.KEYS["orchestrator.max_off_policy_steps"].default)
    plan.warnings.append(LAG.format(steps=steps, loss=loss))


def _source(env: str | Mapping[str, Any], plan: Plan) -> dict[str, Any]:
    """One [[orchestrator.train.source]]: the taskset and a local single-agent seat (null harness, subprocess)."""
    if isinstance(env, str):
        fields: dict[str, Any] = {"id": env}
    elif isinstance(env, Mapping):
        fields = dict(env)
    else:
        raise ConfigError(f"prime_rl_config: env={env!r} is invalid: it must be a taskset id such as 'reverse-text' "
                          "or a dict {'id': ..., **taskset fields}")
    taskset_id = fields.get("id")
    if not isinstance(taskset_id, str) or not taskset_id.strip():
        raise ConfigError(f"prime_rl_config: env={env!r} has no taskset id: pass 'reverse-text' or "
                          "{'id': 'reverse-text', ...}")
    bare = taskset_id.split("/")[-1].split("@")[0]
    _check_taskset_fields(bare, fields, plan)
    return {"name": bare, "env": {"taskset": fields,
                                  "agent": {"harness": {"id": "null"}, "runtime": {"type": "subprocess"}}}}


def _check_taskset_fields(bare: str, fields: dict[str, Any], plan: Plan) -> None:
    """A known taskset's fields: each must exist, and fit its type and declared values; ordered pairs in order."""
    extra = [name for name in fields if name not in schema.TASKSET_COMMON]
    known = schema.TASKSET_FIELDS.get(bare)
    if known is None:
        plan.warnings.append(f"taskset {bare!r} is not in the writer's table: prime-rl imports it at config time "
                             "(install the package, or validation fails with ModuleNotFoundError); the writer "
                             "assumes one agent seat (env.agent)"
                             + (f", and does not check its fields {', '.join(extra)}" if extra else "") + ".")
        return
    found = [f"has no field {name!r}{_closest(name, known)} (its fields are {', '.join(sorted(known)) or 'none'} "
             f"plus {', '.join(schema.TASKSET_COMMON)})" for name in extra if name not in known]
    found += [f"field {name}={fields[name]!r} is invalid: it {why} ({known[name].where})"
              for name in extra if name in known and (why := schema.type_problem(known[name], fields[name]))]
    if not found:
        found = [f"has {low}={fields.get(low, known[low].default)!r} above {high}="
                 f"{fields.get(high, known[high].default)!r}: it needs {low} <= {high} (its loader asserts it)"
                 for low, high in schema.TASKSET_ORDER.get(bare, ())
                 if fields.get(low, known[low].default) > fields.get(high, known[high].default)]
    if found:
        raise ConfigError(f"prime_rl_config: taskset {bare!r} " + "; ".join(found) + ". Fix each in env= (--env-field on the command line)")


def _closest(name: str, known: Mapping[str, Any]) -> str:
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""
