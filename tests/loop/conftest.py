import pytest


@pytest.fixture
def quick():
    """Settings for a short, quiet run on the built-in tiny model and the 'case' task."""
    return dict(steps=3, rollouts_per_step=8, warm_start_steps=0, eval_tasks=0, export=False, progress=False,
                save_every=1, lr_schedule="constant")
