"""Fine-tuning defaults shared by every task (BERT paper, section 4 and appendix A.3):
batch 32, Adam lr in 5e-5..2e-5, 3 epochs, linear warm-up over the first 10% of the
steps then linear decay, weight decay 0.01, dropout 0.1. Each task file imports this
and fills in `task` and `data`.
"""

import ml_collections

from configs import bert_base


def get_config():
  c = ml_collections.ConfigDict()
  c.seed = 0  # Head initialisation, dropout and data order.
  # XLA's persistent compilation cache of `python -m bertjax.finetune`: a rerun, another
  # seed or sweep point with the same shapes loads its compiled steps instead of
  # compiling them. '' disables it; the JAX_COMPILATION_CACHE_DIR variable, when set, wins.
  c.compilation_cache_dir = "~/.cache/bertjax/xla"
  # Pretrained encoder: a bertjax workdir or a Hugging Face dir; or a fine-tuning workdir
  # (intermediate fine-tuning, e.g. MNLI before RTE): its encoder, and a fresh head ...
  c.init_from = ""
  c.init_keep_head = False  # ... or its task head (same task, same labels in order).
  c.tokenizer = ""  # Only without init_from (random init): vocab.txt / tokenizer dir.
  # The encoder when init_from is empty; with init_from, the checkpoint's own config
  # replaces it (only `dtype` is taken from here).
  c.model = bert_base.get_config().model

  c.task = ml_collections.ConfigDict()
  # classification | tagging | squad | span_ner | multiple_choice | retrieval (an embedding
  # model: configs/finetune/retrieval.py)
  c.task.name = "classification"
  c.task.max_seq_length = 128  # Tokens per feature, special tokens included.
  c.task.labels = ()  # Label names in order; () takes the sorted training labels.
  # How batches are cut (bertjax/tasks/batching.py): 'bucket' pads each batch to its
  # longest row rounded up to a bucket length (few shapes, each compiled once), 'max'
  # every row to max_seq_length, 'pack' (classification, tagging) several examples to
  # a row of max_seq_length in training, each isolated (evaluation: bucketed); 'auto'
  # packs where the task can (classification, fine-tuned tagging), else buckets.
  c.task.batching = "auto"
  c.task.bucket_lengths = ()  # () = powers of two from 16, then max_seq_length.
  c.task.metrics = ()  # Dev metrics reported first; [0] selects (() = the task's own).
  c.task.glue = ""  # The GLUE task it is (glue.py): names predict --glue_dir's file.

  c.data = ml_collections.ConfigDict()
  c.data.train = ""  # Training file (native format or .jsonl) or tfds:NAME.
  c.data.dev = ""  # Dev file: evaluated after training, selects the best sweep run.
  # A second dev set, reported too (its metrics suffixed _mm): MNLI's mismatched one
  # (dev_mismatched.tsv, or tfds:glue/mnli, whose split validation_mismatched is read).
  c.data.dev_mismatched = ""

  c.freeze = ml_collections.ConfigDict()
  c.freeze.embeddings = False  # Keep the embedding layer fixed.
  c.freeze.top_k_layers = -1  # k >= 0: train only the top k blocks (+ pooler, head).

  c.train = ml_collections.ConfigDict()
  c.train.batch_size = 32  # Global batch of features.
  c.train.grad_accum_steps = 1  # Micro-batches accumulated per optimizer step.
  c.train.eval_batch_size = 64  # Dev batch (rounded up to the data-parallel size).
  c.train.num_epochs = 3  # Passes over the training features.
  c.train.learning_rate = 2e-5  # Peak learning rate (the paper sweeps 5e-5..2e-5).
  c.train.warmup_fraction = 0.1  # Warm-up steps: int(fraction * all steps), as BERT's code.
  # Linear decay to 0 from the peak at the end of warm-up (Hugging Face's
  # get_linear_schedule_with_warmup), or 'step0': BERT's TF code, the decay measured
  # from step 0 so it resumes at peak * (1 - warmup_fraction) (docs/finetuning.md).
  c.train.decay_start = "warmup_end"
  c.train.optimizer = "adamw"  # 'adamw' or 'lamb'.
  c.train.weight_decay = 0.01  # BERT's; not on LayerNorm parameters or biases (HF's: 0).
  c.train.b1 = 0.9  # Adam beta1.
  c.train.b2 = 0.999  # Adam beta2.
  c.train.eps = 1e-8  # Adam epsilon (PyTorch's / Hugging Face's; BERT's TF code: 1e-6).
  c.train.max_grad_norm = 1.0  # Global-norm clipping; 0 disables.
  c.train.log_every = 50  # Steps between logged training metrics.
  c.train.checkpoint_every = 1000  # Steps between checkpoints (and at the end).
  c.train.max_to_keep = 1  # Checkpoints kept in the workdir.
  # The learning-rate schedule's shape (schedule: 'linear', or 'wsd' with
  # decay_fraction, decay_shape, final_lr_fraction), decouple_lr, spike skipping
  # (skip_step_on_spikes, spike_window, spike_sigma), profile_steps and
  # checkpoint.on_corrupt: as in pretraining (described in bert_base.py).
  for field in ("schedule", "decay_fraction", "decay_shape", "final_lr_fraction",
                "decouple_lr", "skip_step_on_spikes", "spike_window", "spike_sigma",
                "profile_steps"):
    c.train[field] = bert_base.get_config().train[field]
  c.checkpoint = bert_base.get_config().checkpoint

  c.sweep = ml_collections.ConfigDict()
  c.sweep.learning_rates = ()  # The paper's grid, e.g. (5e-5, 4e-5, 3e-5, 2e-5).
  c.sweep.seeds = ()  # Restarts: new head init and data order, same pretrained weights.

  # Multi-process jobs (--coordinator_address / --multihost): join and heartbeat timeouts.
  c.distributed = bert_base.get_config().distributed
  c.mesh = bert_base.get_config().mesh
  c.logical_axis_rules = bert_base.LOGICAL_AXIS_RULES
  return c
