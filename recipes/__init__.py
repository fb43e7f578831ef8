"""The experiment runner's recipes (``demo.py --task NAME``): one per column of the paper's table, each a
:class:`recipes.base.Recipe` in its own module, registered here by one line."""

from recipes.alfworld import RECIPE as ALFWORLD
from recipes.auto_explore import RECIPE as AUTO_EXPLORE
from recipes.taxi_dropoff import RECIPE as TAXI_DROPOFF
from recipes.taxi_pickup import RECIPE as TAXI_PICKUP

RECIPES = {recipe.name: recipe for recipe in (TAXI_PICKUP, AUTO_EXPLORE, TAXI_DROPOFF, ALFWORLD)}
DEFAULT = TAXI_PICKUP.name  # `make demo` and `python demo.py`
