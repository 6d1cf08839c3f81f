"""bertjax.hf."""
