"""The Python API: load a pretrained encoder (a Hugging Face dir, a bertjax pretraining
workdir or a fine-tuning workdir) and run it, or a fine-tuned model whole.

    from bertjax import api
    pretrained = api.load_pretrained("path/to/model")
    out = pretrained.encode(["a sentence", "another one"])
    out["hidden_states"]  # [layers + 1, batch, seq, hidden], embedding output first
    pretrained.fill_mask("please turn [MASK] homework in .")

    finetuned = api.load_finetuned("path/to/finetuning/workdir")  # task, labels, params

The programs (`python -m bertjax.main`, `finetune`, ...) run `bertjax.train.pretrain`
and `bertjax.tasks.finetune`; these are their library calls too.
"""

from bertjax.checkpoint.pretrained import Pretrained, TaskHead, load_pretrained
from bertjax.tasks.finetuned import Finetuned, load_finetuned

__all__ = ["Finetuned", "Pretrained", "TaskHead", "load_finetuned", "load_pretrained"]
