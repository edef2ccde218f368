"""The same cycle gives the same gradient whichever trainer runs it, and whatever the loss's name.

- A library method (``method:grpo``, ``cross_entropy`` with weights = c) and a build_loss algorithm (``ppo``)
  on one real sample: through a ``wai serve`` ``RunClient`` and through a ``TrainingEngine`` directly, the
  loss, the gradient norm and the weights after the step agree.
- On-policy, ``importance_sampling`` with advantages A has the gradient of the kernel with weights c = A
  (the ratio is 1 and its derivative is the log-probability's): the coefficient view of an algorithm.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.algorithms.conftest import context
from whileai.algorithms import algorithm
from whileai.algorithms.core import Group, Sample, SampleRequest, grade
from whileai.engine import TrainingEngine
from whileai.envs import load_taskset, render_prompt

PROBE = [1, 100, 101, 102, 103, 104, 105]
ADAM = {"learning_rate": 1e-2}


def real_sample(engine: TrainingEngine) -> tuple[Sample, SampleRequest]:
    """Four prompts x four completions sampled from ``engine``'s own (current) weights, graded."""
    taskset = load_taskset("builtin:case")
    tasks = taskset.split("train")[:4]
    request = SampleRequest(4, {"max_tokens": 4, "temperature": 1.0, "seed": 11}, engine.save_weights_for_sampler(),
                            cap_is_answer_length=True)
    prompts = [render_prompt(engine.tokenizer, t) for t in tasks]
    ctx = context(None, client=engine, taskset=taskset)
    samples = engine.sample(prompts, 4, request.sampling_params, version=request.version)
    return Sample([Group(t, p, [grade(ctx, t, s, request) for s in seqs])
                   for t, p, seqs in zip(tasks, prompts, samples)], request.version), request


def one_cycle(trainer, name: str, smp: Sample, request: SampleRequest, capabilities=None) -> tuple[dict, np.ndarray]:
    algo = algorithm(name)
    ctx = context(algo.make_options(), capabilities=capabilities, client=trainer)
    result = algo.run_cycle(smp, 0, request, ctx, ADAM)
    return result.metrics, np.asarray(trainer.compute_logprobs(PROBE)["logprobs"][1:])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["method:grpo", "method:rloo", "ppo", "maxrl"])
def test_same_update_through_the_service_as_through_the_engine(client, name):
    smp, request = real_sample(TrainingEngine("builtin:tiny", seed=0))
    direct, direct_probe = one_cycle(TrainingEngine("builtin:tiny", seed=0), name, smp, request)
    session = client.create_session()
    try:
        run = session.create_run("builtin:tiny", seed=0)
        remote, remote_probe = one_cycle(run, name, smp, request, capabilities=client.capabilities())
    finally:
        session.close()
    assert direct["grad_norm"] > 0
    assert remote["loss"] == pytest.approx(direct["loss"], rel=1e-6, abs=1e-9)
    assert remote["grad_norm"] == pytest.approx(direct["grad_norm"], rel=1e-6)
    np.testing.assert_allclose(remote_probe, direct_probe, atol=1e-6)


@pytest.mark.slow
def test_on_policy_importance_sampling_equals_the_kernel_with_weights_a():
    smp, request = real_sample(TrainingEngine("builtin:tiny", seed=0))
    algo = algorithm("grpo_nostd")
    req = algo.build_loss(smp, 0, request, context(algo.make_options()))
    assert req.loss_fn == "importance_sampling" and req.data
    kernel = []
    for d in req.data:
        inputs = d["loss_fn_inputs"]
        kernel.append({"model_input": d["model_input"],
                       "loss_fn_inputs": {"target_tokens": inputs["target_tokens"], "weights": inputs["advantages"]}})
    ratio_engine, kernel_engine = TrainingEngine("builtin:tiny", seed=0), TrainingEngine("builtin:tiny", seed=0)
    ratio_engine.forward_backward(req.data, "importance_sampling")
    kernel_engine.forward_backward(kernel, "cross_entropy")
    for name, param in ratio_engine.named_params.items():
        other = kernel_engine.named_params[name].grad
        assert param.grad is not None and other is not None
        np.testing.assert_allclose(param.grad.numpy(), other.numpy(), rtol=1e-4, atol=1e-7)
