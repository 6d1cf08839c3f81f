"""bertjax: pretrain and fine-tune BERT-family encoders in JAX/Flax."""

__version__ = "0.1.0"


def load_pretrained(path, **kwargs):
  """Loads a bertjax workdir/checkpoint or a Hugging Face directory; see `bertjax.api`."""
  from bertjax.api import load_pretrained as _load  # Deferred: keeps `import bertjax` light.
  return _load(path, **kwargs)
