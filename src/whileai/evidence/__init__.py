"""Evidence: the paper recipes, each a baseline arm against the recipe arm on one budget over seeds.

    from whileai.evidence import recipe, run_recipe
    print(run_recipe(recipe("flash_reinforce"), seeds=5, lag=4))

See docs/evidence.md and recipes/papers/README.md.
"""

from whileai.evidence.papers import PAPERS, RECIPES, recipe
from whileai.evidence.runner import Arm, Recipe, RecipeResult, drift_reached, run_recipe

__all__ = ["PAPERS", "RECIPES", "Arm", "Recipe", "RecipeResult", "drift_reached", "recipe", "run_recipe"]
