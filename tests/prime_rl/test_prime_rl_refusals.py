"""Every refusal: a ValueError that names what prime-rl lacks (with its file), what the method needs, and what to do."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

import whileai as wai
from whileai.errors import ConfigError

from .cases import QWEN, SAMPLER, TEACHER

ENV = "refunds-v1"


def _write(method, **kwargs) -> Callable[[], object]:
    return lambda: wai.prime_rl_config(ENV, method, model=kwargs.pop("model", QWEN), **kwargs)


# case -> (the call, phrases naming the missing capability, a phrase of the alternative)
REFUSED: dict[str, tuple[Callable[[], object], tuple[str, ...], str]] = {
    "flash_reinforce": (_write(wai.FlashReinforce()), ("whole batch's mean reward", "drops a whole trajectory"),
                        "method.update(batch)"),
    "sao": (_write(wai.SAO()), ("needs a value critic", "no value network"), "critic's 'values'"),
    "bpco": (_write(wai.BPCO()), ("bounded value critic", "no value network"), "critic's 'values'"),
    "ppo": (_write("ppo"), ("never clips the ratio",), "method.update(batch)"),  # wai.PPO: the engine's ppo loss
    "dpo": (_write(wai.DPO()), ("no preference mode",), "ref_logprobs on each row"),
    "rm": (_write(wai.RM()), ("neither trains nor hosts reward models",), "judge inside your taskset"),
    "groupwise_grading": (_write(wai.GroupwiseGrading(grader=lambda rows: [0.0] * len(rows))),
                          ("no hook for it",), "taskset's reward function"),
    "reinforce_ada": (_write(wai.methods.ReinforceAda()), ("fixed group_size",), "method.update(batch)"),
    "async_icepop": (_write(wai.Async("grpo", correction="icepop")), ("ratio leaves the band", "no such loss"),
                     "correction='ipo'"),
    "async_tis": (_write(wai.Async("rae", correction="tis")), ("capped at max_ratio", "no such loss"),
                  "correction='ipo'"),
    "async_flash": (_write(wai.Async(wai.FlashReinforce())), ("whole batch's mean reward",),
                    "method.update(batch)"),
    "grpo_beta": (_write(wai.GRPO(beta=0.04)), ("KL(pi || pi_ref)", "no reference"), "set beta=0"),
    "grpo_std_strict": (_write(wai.GRPO(), strict=True), ("standard deviation", "no std"), "loss_type='dr_grpo'"),
    "grpo_one": (_write(wai.GRPO(rollouts_per_prompt=1)), ("at least two rollouts", "advantage 0"), "'rae'"),
    "grpo_override_one": (_write("grpo", **{"orchestrator.group_size": 1}), ("at least two rollouts",), "'rae'"),
    "max_rl_one": (_write(wai.MaxRL(rollouts_per_prompt=1)), ("at least two rollouts",), "'rae'"),
    "rloo_one": (_write(wai.RLOO(rollouts_per_prompt=1)), ("at least two rollouts",), "'rae'"),
    "opd_no_teacher": (_write(wai.OPD()), ("needs [orchestrator.algo.teacher]", "never starts it"),
                       "wai.Endpoint(base_url="),
    "opd_unnamed_teacher": (_write(wai.OPD(wai.Endpoint("http://127.0.0.1:8001/v1"))), ("requires name",),
                            "model='<the name the server serves>'"),
    "opd_vocab": (_write(wai.OPD(TEACHER), model_vocab_size=128256), ("one tokenizer", "151669", "128256"),
                  "same-family teacher"),
    "opd_forward_kl": (_write(wai.OPD(TEACHER, divergence="forward_kl")), ("ref_kl component is fixed",),
                       "divergence='reverse_kl'"),
    "opsd_jsd": (_write(wai.OPSD(divergence="jsd")), ("ref_kl component is fixed",), "divergence='reverse_kl'"),
    "opsd_feedback": (_write(wai.OPSD(privileged="feedback")), ("feedback on the student's own attempt",),
                      "privileged='hint'"),
    "sft_no_source": (_write(wai.SFT()), ("needs [orchestrator.algo.sampling.source]",), "teacher=wai.Endpoint"),
    "sft_unnamed_source": (_write(wai.SFT(), teacher=wai.Endpoint("http://127.0.0.1:8002/v1")),
                           ("requires name",), "model='<the name the server serves>'"),
    "strict_clip": (_write(wai.MaxRL(), strict=True), ("cannot be honoured", "clips no ratio"),
                    "drop strict=True"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refusal_names_the_missing_capability_and_an_alternative(case: str) -> None:
    call, missing, alternative = REFUSED[case]
    with pytest.raises(ValueError) as caught:
        call()
    assert isinstance(caught.value, ConfigError)
    text = str(caught.value)
    assert text.startswith("prime_rl_config: ")
    for phrase in missing:
        assert phrase in text, (case, phrase)
    assert "prime_rl/" in text, case  # the file in prime-rl where the capability would live
    head, sep, instead = text.partition(" What you can do: ")
    assert sep and alternative in instead, case


def test_sao_refusal_follows_the_lesson() -> None:
    with pytest.raises(ValueError) as caught:
        wai.prime_rl_config("refunds-v1", wai.SAO(), model="Qwen/Qwen3-4B")
    assert str(caught.value).startswith(
        "prime_rl_config: wai.SAO needs a value critic, and prime-rl only ever hosts the trainable policy "
        "(prime_rl/configs/algorithm.py, FrozenModelConfig): no value network, so no GAE advantage.")
    assert "apply method.update(batch) inside your own trainer loop" in str(caught.value)


def test_refusal_by_name_matches_refusal_by_object() -> None:
    for name, obj in (("sao", wai.SAO()), ("bpco", wai.BPCO()), ("flash_reinforce", wai.FlashReinforce())):
        with pytest.raises(ConfigError) as by_name:
            wai.prime_rl_config(ENV, name, model=QWEN)
        with pytest.raises(ConfigError) as by_object:
            wai.prime_rl_config(ENV, obj, model=QWEN)
        assert str(by_name.value) == str(by_object.value)


def test_matching_vocabularies_are_written() -> None:
    cfg = wai.prime_rl_config(ENV, wai.OPD(TEACHER), model=QWEN, model_vocab_size=151669)
    assert cfg.config["orchestrator"]["algo"]["type"] == "opd"
    assert not any("was not compared" in w for w in cfg.warnings)


def test_without_strict_the_std_goes_to_ignored() -> None:
    cfg = wai.prime_rl_config(ENV, wai.GRPO(), model=QWEN)
    assert "division by the group's std" in cfg.ignored["GRPO.loss_type"]
    strict_ok = wai.prime_rl_config(ENV, wai.SFT(normalize="token_mean"), model=QWEN, teacher=SAMPLER, strict=True)
    assert strict_ok.ignored == {}


def test_icepop_is_not_ipo_so_it_is_refused_not_rewritten() -> None:
    """The docs' worked pair: mu=0.5 -> pi=0.9 (ratio 1.8, moved 0.4) and mu=0.01 -> pi=0.08 (ratio 8, moved 0.07).

    ipo (threshold 0.3) masks the first and keeps the second; icepop (band [0.5, 5]) does the opposite. SFT's
    c = 1 per token shows the correction's own factor.
    """
    rows = [{"reward": 1.0, "logprobs": [math.log(0.9), math.log(0.08)],
             "behavior_logprobs": [math.log(0.5), math.log(0.01)]}]
    ipo = wai.Async(wai.SFT(), correction="ipo").update(rows).coefficients[0]
    icepop = wai.Async(wai.SFT(), correction="icepop").update(rows).coefficients[0]
    assert list(ipo) == [0.0, 1.0] and list(icepop) == [1.0, 0.0]
    with pytest.raises(ConfigError, match="no such loss"):
        wai.prime_rl_config(ENV, wai.Async(wai.SFT(), correction="icepop"), model=QWEN, teacher=SAMPLER)


def test_cli_names_a_refusal_and_an_error_apart(capsys) -> None:
    from whileai.cli import main

    assert main(["prime-rl", "--env", ENV, "--method", "ppo", "--knob", "clip=0.1", "--model", QWEN]) == 2
    assert "refused: prime_rl_config: wai.PPO clips the trainer/sampler ratio" in capsys.readouterr().err
    assert main(["prime-rl", "--env", ENV, "--method", "grpo", "--model", QWEN, "--set", "trainer.lr=1e-6"]) == 2
    assert "wai prime-rl: error: prime_rl_config: override 'trainer.lr'" in capsys.readouterr().err
