"""bertjax.checkpoint.manager."""
