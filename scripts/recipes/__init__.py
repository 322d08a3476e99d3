"""One recipe per model: config, data, training, evaluation and model card.

Entry point: ``python -m scripts.train {translator,generator,classifier}``, which runs ``train_<kind>``
from here. What the recipes share is in ``common``; each kind's recipe is in its own module.
"""

from scripts.recipes.classifier import train_classifier
from scripts.recipes.common import RecipeArgs
from scripts.recipes.generator import train_generator
from scripts.recipes.translator import train_translator

__all__ = ["RecipeArgs", "train_classifier", "train_generator", "train_translator"]
