"""Recipes: one file per recipe, `get_config(arg)` returns an ml_collections ConfigDict."""
