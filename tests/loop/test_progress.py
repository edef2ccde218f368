"""The progress bar is drawn at its first step, so what is printed before it is not split by an empty bar."""

from whileai.loop.hooks.metrics import Progress


def test_lines_before_the_first_step_come_without_a_bar(capsys):
    log = Progress(total=40, initial=0, enabled=True, description="grpo")
    log.write("run plan (value [source]):")
    log.phase("warm start", 14, 0)
    first = capsys.readouterr()
    assert first.out == "run plan (value [source]):\n"
    assert "grpo" not in first.err and "warm start" not in first.err
    log.warm({"warm_start_step": 1, "loss": 2.5, "pass_estimate": 0.0}, total=14, every=5)
    log.close()
    drawn = capsys.readouterr().err
    assert "warm start" in drawn and "/14" in drawn and "grpo" not in drawn


def test_the_bar_switches_back_to_the_method_after_the_warm_start(capsys):
    log = Progress(total=40, initial=0, enabled=True, description="grpo")
    log.phase("warm start", 2, 0)
    log.warm({"warm_start_step": 1, "loss": 2.5, "pass_estimate": 0.0}, total=2, every=5)
    log.phase(None, 40, 0)
    log.update({"reward": 0.5})
    log.close()
    err = capsys.readouterr().err
    assert "grpo" in err.split("warm start")[-1] and "1/40" in err


def test_with_the_bar_off_nothing_goes_to_stderr(capsys):
    log = Progress(total=40, initial=0, enabled=False, description="grpo")
    log.phase("warm start", 10, 0)
    log.warm({"warm_start_step": 1, "loss": 2.5, "pass_estimate": 0.0}, total=10, every=5)
    log.update({"reward": 0.5})
    log.close()
    out = capsys.readouterr()
    assert out.err == "" and "warm start step 1/10: loss 2.500" in out.out
