"""The request bodies of the training service, declared once (pydantic); the server validates with them.

Datums travel as the engine's datum dicts (``whileai.engine.make_datum``): the server checks their
contents with the engine's own checks, which name the datum and the position. Every operation of a run
carries ``seq_id``: the run executes its operations in ``seq_id`` order (see ``runs.py``).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# The name a user gives a saved state: a file name, nothing that could climb out of the run's folder.
STATE_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$"


class Body(BaseModel):
    """A request body; an unknown field is a 422 naming it (never silently ignored)."""

    model_config = ConfigDict(extra="forbid")


class CreateRun(Body):
    base_model: str = Field("builtin:tiny", description="a model the server lists in capabilities()['models']")
    lora_rank: int = Field(0, ge=0, le=4096, description="LoRA rank; 0 trains every weight (at most 4096: a rank "
                                                         "past a model's width adds nothing but memory)")
    seed: int = Field(0, ge=0, le=2**63 - 1, description="initialises built-in models and LoRA matrices")
    kind: Literal["policy", "critic"] = Field("policy", description="'critic' adds a value head (ppo_critic)")
    critic_learning_rate: float = Field(1e-5, gt=0, description="the value head's own AdamW rate (critic runs)")
    reward_range: tuple[float, float] | None = Field(None, description="bound the value head to [low, high]")
    reference: bool | None = Field(None, description="keep a reference policy; None = only when free (LoRA)")
    from_state: str | None = Field(None, pattern=r"^run-[a-z0-9]+/" + STATE_NAME[1:],
                                   description="RUN_ID/NAME: a state another run of this token saved; the new run "
                                               "holds a copy under NAME (load_state(NAME) restores it)")


class Op(Body):
    seq_id: int = Field(ge=0, description="this operation's place in the run's order, 0, 1, 2, ...")


class ForwardBackward(Op):
    data: list[dict[str, Any]] = Field(description="datums: {'model_input': [...], 'loss_fn_inputs': {...}}")
    loss_function: str = Field(description="a loss name from capabilities()['losses']")
    loss_config: dict[str, Any] | None = Field(None, description="that loss's config keys; None = defaults")
    sampling_params: dict[str, Any] | None = Field(None, description="score under the sampler's distribution")
    logprobs_for: str | list[int] = Field("every", description="'every' position, the loss's ('scored'), or per "
                                          "datum its last n positions (TrainingEngine.forward)")


class Forward(ForwardBackward):
    loss_function: str = "cross_entropy"
    reference: bool = Field(False, description="score under the reference policy")


class OptimStep(Op):
    adam_params: dict[str, Any] | None = Field(None, description="AdamParams fields; None = the defaults")


class Sample(Op):
    prompt_tokens: list[int] | list[list[int]] = Field(description="one prompt, or a list of prompts")
    num_samples: int = Field(1, ge=1)
    sampling_params: dict[str, Any] = Field(description="SamplingParams fields; max_tokens is required")
    version: int | None = Field(None, ge=0, description="saved sampler weights; None = the current ones")
    prompt_logprobs: bool = Field(False, description="also score the prompt (one prompt only), Tinker's way")
    topk_prompt_logprobs: int = Field(0, ge=0, description="also the prompt's k most likely tokens per position")
    topk_sample_logprobs: int = Field(0, ge=0, description="the k most likely tokens at every sampled position")
    target_prompt_logprobs: list[list[int]] | None = Field(
        None, description="[len(prompt) - 1, K] token ids to score at prompt positions 1..; -1 asks nothing")
    prompt_alt_tokens_k: int = Field(0, ge=0, le=256, description="k draws at every prompt position after the first")


class Logprobs(Op):
    tokens: list[int]
    top_k: int = Field(0, ge=0)
    reference: bool = False
    sampling_params: dict[str, Any] | None = None


class State(Op):
    name: str = Field(pattern=STATE_NAME, description="letters, digits, '.', '_', '-'; up to 100 characters")
    optimizer: bool = Field(True, description="load_state: restore the optimizer's moments too (False: fresh)")


class AddCritic(Op):
    learning_rate: float = Field(gt=0, description="the value head's own AdamW learning rate")
    reward_range: tuple[float, float] | None = Field(None, description="bound the value head to [low, high]")


class Export(Op):
    merged: bool = Field(False, description="a full merged model instead of a LoRA adapter")


# Every operation of a run: its URL name and its body. The routes and the client both read this.
OPERATIONS: dict[str, type[Op]] = {
    "forward_backward": ForwardBackward,
    "forward": Forward,
    "optim_step": OptimStep,
    "save_weights_for_sampler": Op,
    "sample": Sample,
    "logprobs": Logprobs,
    "save_state": State,
    "load_state": State,
    "export_lora": Export,
    "add_critic": AddCritic,
    "finish": Op,
    "noop": Op,
}
