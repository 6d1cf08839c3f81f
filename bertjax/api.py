"""The Python API: load a pretrained encoder (a Hugging Face dir, a bertjax pretraining
workdir or a fine-tuning workdir) and run it, or a fine-tuned model whole.

    from bertjax import api
    pretrained = api.load_pretrained("path/to/model")
    out = pretrained.encode(["a sentence", "another one"])
    out["hidden_states"]  # [layers + 1, batch, seq, hidden], embedding output first
    pretrained.fill_mask("please turn [MASK] homework in .")

    finetuned = api.load_finetuned("path/to/finetuning/workdir")  # task, labels, params
    encoder = api.load_encoder("path/to/retrieval/workdir")  # or a sentence-transformers
    vectors = encoder.encode(["what is a tuple?"], kind="query")  # folder: [1, E]

The programs (`python -m bertjax.main`, `finetune`, ...) run `bertjax.train.pretrain`
and `bertjax.tasks.finetune`; these are their library calls too.
"""

from bertjax.checkpoint.pretrained import Pretrained, TaskHead, load_pretrained
from bertjax.tasks.embedding import Encoder, load_encoder
from bertjax.tasks.finetuned import Finetuned, load_finetuned

__all__ = ["Encoder", "Finetuned", "Pretrained", "TaskHead", "load_encoder",
           "load_finetuned", "load_pretrained"]
