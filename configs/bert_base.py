"""BERT-base (Devlin et al. 2019): L=12, H=768, A=12, ~110M parameters.

Reproduces the pretraining behind the paper's BERT-base rows of Table 1 (GLUE test)
and Table 2 (SQuAD v1.1), its appendix A.2 recipe: Adam lr 1e-4, b1 0.9, b2 0.999,
weight decay 0.01 (not on LayerNorm or biases), 10k warm-up steps then linear decay,
batch 256, 1M steps, MLM 15% (80/10/10) plus NSP (`objectives`), dropout 0.1 everywhere, GELU; 90% of
the steps on sequences of 128 tokens, then 10% on 512 (to learn the positions), with
at most 20 then 80 masked predictions per sequence (about 15% of the length, as
google-research/bert sets max_predictions_per_seq). Adam epsilon 1e-6 is
google-research/bert's. Every other recipe imports this file and overrides what differs.

Launch (the corpus: text files, one sentence a line, a blank line between documents):

  python -m bertjax.main --config=configs/bert_base.py --workdir=/tmp/bert_base \
      --config.data.corpus='/data/wiki/*.txt' --config.data.tokenizer.path=vocab.txt
"""

import ml_collections

from configs import model_section

# Logical axis name -> mesh axis ('data', 'fsdp', 'tensor'), in order of precedence.
# Parameters: FSDP shards the hidden ('embed') dimension of every matrix over 'fsdp';
# Megatron-style tensor parallelism splits heads, MLP and vocabulary over 'tensor'.
# Activations: the batch over 'data' and 'fsdp', heads/MLP/vocab over 'tensor'.
LOGICAL_AXIS_RULES = (
    ("activation_batch", ("data", "fsdp")),
    ("activation_length", None),
    ("activation_embed", None),
    ("activation_heads", "tensor"),
    ("activation_kv", None),
    ("activation_mlp", "tensor"),
    ("activation_vocab", "tensor"),
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("heads", "tensor"),
    ("kv", None),
    ("layers", None),  # The stacked-layer axis of scanned parameters: never sharded.
    ("mlp", "tensor"),
    ("hidden", None),
    ("position", None),
    ("segment", None),
    ("classes", None),
)


def get_config(arg=None):
  del arg
  c = ml_collections.ConfigDict()
  c.seed = 0  # One seed for initialisation, dropout, data order and masking.
  # XLA's persistent compilation cache: a restart (preemption, a rerun, another seed of
  # the same shapes) loads the compiled steps instead of compiling them again (BERT-base
  # on a fresh H200: 69-114 s, from the cache 5-7 s). On a pod, a gs:// folder shares it
  # between the hosts (JAX writes it from process 0 only). '' disables it; the
  # JAX_COMPILATION_CACHE_DIR variable, when set, wins.
  c.compilation_cache_dir = "~/.cache/bertjax/xla"
  # What pretraining minimises, by name (bertjax/objectives/), the sum of their losses:
  # 'mlm' masked-LM; 'nsp' next-sentence prediction (its rows are sentence pairs, not
  # packed; needs model.pooler); 'sbo' SpanBERT's span-boundary objective (needs
  # data.masking='span'). Each puts its head on the model: ('mlm',) is RoBERTa's.
  # ('rtd',) alone: ELECTRA's replaced-token detection (family 'electra', a generator of
  # config.generator's sizes and config.rtd.discriminator_weight; configs/electra_small.py).
  c.objectives = ("mlm", "nsp")
  # Continued pretraining (bertjax/train/continued.py): a bertjax workdir or a Hugging
  # Face dir (BERT, RoBERTa, XLM-R, ModernBERT, ELECTRA, DeBERTa) whose encoder and the
  # heads of config.objectives the run starts from (heads it lacks start fresh; the
  # optimizer, schedule and step start afresh; its tokenizer is used unless
  # data.tokenizer.path is given). The model section must agree
  # with it: configs/continued.py takes it from the checkpoint. '' = random weights.
  c.init_from = ""
  # With init_from and ('rtd',): the generator's checkpoint (ELECTRA and DeBERTa-v3
  # publish one beside the discriminator); '' = init_from's own generator when it is a
  # bertjax workdir that trained one, else a fresh generator.
  c.init_generator_from = ""
  c.vocab_extension = ml_collections.ConfigDict()  # New tokens (with init_from only).
  c.vocab_extension.tokens_file = ""  # A file of words to add, one a line; or ...
  c.vocab_extension.num_new_tokens = 0  # ... the N most useful, learned from a corpus:
  # a source of data.corpus's mixture by name (e.g. 'domain'), a corpus spec, or '' for
  # the run's corpus.
  c.vocab_extension.corpus = ""
  # The vocabulary's rows (with new tokens) padded to a multiple of this (the matmul
  # tiles GPUs and TPUs like); padding rows are never predicted. 0: no padding.
  c.vocab_extension.pad_to_multiple = 64

  # BERT-base (H=768, L=12, A=12, learned positions, segment A/B embeddings, dropout 0.1,
  # the truncated normal of google-research/bert): the family's defaults, documented in
  # bertjax/model/bert.py and bertjax/model/config.py (every field can be overridden).
  c.model = model_section("bert")

  c.data = ml_collections.ConfigDict()
  # 'embedded' (ships with Python), or a path / glob / directory, local or gs://, of
  # text, JSON lines (.gz, .zst: Dolma), Parquet (FineWeb, DCLM), Arrow or a `datasets`
  # save_to_disk directory; or tfds:NAME; or a prepared directory. A weighted mixture:
  # 'NAME:WEIGHT=SPEC,...', e.g. 'general:0.3=/data/fineweb,domain:0.7=/data/notes'
  # (sources interleaved by weight, evaluated each on its own: eval/NAME/...).
  c.data.corpus = ""
  # The key (JSON lines, TFDS) or column (Parquet, Arrow) holding the text.
  c.data.text_field = "text"
  # A line break inside a document: 'space' (its lines are one running text, split into
  # sentences: wrapped text, BERT's one sentence a line; a line's first word tokenized
  # as after a space, as in the paragraph it comes from) or 'apart' (each line a unit
  # tokenized alone, its first word as a text's first: transformers' run_mlm.py and
  # fairseq's encoders; for files whose lines are separate texts; NSP's sentences are
  # then the lines). The ids differ for a byte-level BPE only (WordPiece and
  # SentencePiece ignore the space). docs/pretraining.md measures both.
  c.data.line_breaks = "space"
  c.data.max_seq_length = 512  # Tokens per example, [CLS] and [SEP]s included.
  c.data.max_predictions_per_seq = 80  # Masked positions gathered per example.
  c.data.masked_lm_prob = 0.15  # Fraction of tokens chosen for prediction.
  # A masking rate that changes with the step: ((fraction of steps, rate), ...)
  # summing to 1, e.g. ((0.74, 0.3), (0.22, 0.15), (0.04, 0.05)) for mmBERT's 2T /
  # 600B / 100B tokens at 30% / 15% / 5%. Each phase's max_predictions_per_seq scales
  # by rate / masked_lm_prob; held-out batches stay at masked_lm_prob (comparable
  # throughout). () trains at masked_lm_prob.
  c.data.masked_lm_prob_phases = ()
  c.data.mask_token_prob = 0.8  # Of the chosen: replaced by [MASK] ...
  c.data.random_token_prob = 0.1  # ... by a random token; the rest stay unchanged.
  c.data.masking = "token"  # 'token' (BERT), 'whole_word' or 'span' (SpanBERT).
  # Predictions per row: 'fixed' round(masked_lm_prob x its maskable tokens) (BERT's
  # create_pretraining_data.py) or 'per_token' each with probability masked_lm_prob
  # (transformers' DataCollatorForLanguageModeling, the ModernBERT authors'); at most
  # max_predictions_per_seq either way (give per_token room above the mean).
  c.data.masked_lm_draw = "fixed"
  # True: [CLS] and [SEP] (any token but padding) may be chosen too (the ModernBERT
  # authors' packer); False: never (BERT, RoBERTa, transformers' collator).
  c.data.mask_special_tokens = False
  c.data.random_token_distribution = "uniform"  # Random replacements: or 'unigram'.
  c.data.span_geometric_p = 0.2  # span: span lengths ~ Geometric(p) in words ...
  c.data.max_span_length = 10  # ... clipped at this many words.
  c.data.short_seq_prob = 0.1  # NSP: chance of a shorter target length.
  c.data.dupe_factor = 5  # NSP: passes over the corpus with different pairings.
  # No NSP: rows cross documents with a separator between two ('full_sentences',
  # RoBERTa's), or back to back ('stream'); or each row ends with its document
  # ('doc_sentences').
  c.data.packing = "full_sentences"
  c.data.isolate_documents = False  # Packed rows: no attention across documents.
  # Sequence-length phases: ((fraction of steps, length[, max predictions]), ...); the
  # predictions scale with the length unless given (80 at 512 -> 20 at 128). The paper:
  # 90% of the steps at 128, then 512. () trains at max_seq_length throughout.
  c.data.length_phases = ((0.9, 128), (0.1, 512))
  # Multilingual: 'en=/data/en/*.txt,sw=/data/sw/*.txt' (corpus ''), sampled with
  # language_alpha below, or 'en:0.6=...,sw:0.4=...' with weights of your own.
  c.data.languages = ""
  c.data.language_alpha = 0.3  # Languages sampled with q_i ~ p_i^alpha (XLM-R: 0.3).
  # p_i = n_i / sum_j n_j of eq. 11.7 counts each language's 'sentences' (the
  # textbook's n_i), or its 'tokens' or 'characters' (tokenizer text and batches alike).
  c.data.language_counts = "sentences"
  # Sources by phase (mmBERT's cascading annealed language learning): ((fraction of
  # steps, sources[, alpha]), ...), sources '' (all of the run's), 'en,de' (those,
  # sampled with q ~ p^alpha, default language_alpha) or 'en:0.3,de:0.7' (weights); a
  # source joins (or leaves) at its phase's first step. () the run's sources throughout.
  c.data.source_phases = ()
  c.data.eval_fraction = 0.02  # Documents held out for evaluation.
  c.data.worker_count = 0  # grain worker processes (0: in the main process).
  # Raw text (or tokenized documents) above this many MB is not built in memory: the
  # run stops and asks for `python -m bertjax.data.prepare --config=...` (0: no limit).
  c.data.raw_text_limit_mb = 64
  c.data.tokenizer = ml_collections.ConfigDict()
  # 'wordpiece', 'sentencepiece' (XLM-R's ids), 'sentencepiece_bert' (DeBERTa-v3's
  # spm.model: [CLS] a [SEP] b [SEP]) or 'byte_level_bpe'.
  c.data.tokenizer.kind = "wordpiece"
  c.data.tokenizer.path = ""  # vocab.txt / .model / directory; '' trains one.
  c.data.tokenizer.lowercase = True  # Uncased WordPiece (bert-base-uncased).
  c.data.tokenizer.vocab_size = 30522  # Size when training a tokenizer.
  # What a tokenizer trains on (and vocab_extension.num_new_tokens learns words from),
  # each source streamed: this many of its sentences kept, drawn uniformly from those
  # read (a million: ~150 MB; 0 keeps all), reading at most read_sentences of it (0:
  # all of it). The log says how many were sampled of how many read.
  c.data.tokenizer.sample_sentences = 1_000_000
  c.data.tokenizer.read_sentences = 0

  c.train = ml_collections.ConfigDict()
  c.train.batch_size = 256  # Global batch (examples per optimizer step).
  # True: every length phase trains on the tokens of batch_size rows of max_seq_length
  # (rows = batch_size * max_seq_length / length: ModernBERT's 576 x 8,192 = 4,608 x
  # 1,024); False: batch_size rows in every phase (BERT's 256 at 128 and at 512).
  c.train.batch_by_tokens = False
  # Batch-size warm-up over this many tokens (rows x length) at the start of the first
  # length phase (0: none): batch_warmup_sizes = n smaller batches B * k / (n + 1),
  # k = 1..n, each for the same number of steps, then B (the ModernBERT authors'
  # packer's ramp; each size is one more compiled shape). See bertjax/data/phases.py.
  c.train.batch_warmup_tokens = 0
  c.train.batch_warmup_sizes = 0  # n, >= 1 with a warm-up.
  c.train.grad_accum_steps = 1  # Micro-batches accumulated per optimizer step.
  c.train.num_steps = 1_000_000  # Optimizer steps.
  # 'adamw', 'lamb' (large batches) or 'stable_adamw' (AdamW with per-tensor update
  # clipping, Wortsman et al. 2023; ModernBERT, which then clips no gradients).
  c.train.optimizer = "adamw"
  c.train.learning_rate = 1e-4  # Peak learning rate.
  # wsd only: ((fraction of num_steps where it starts, peak, weight decay), ...),
  # ascending, after the warm-up and before the final decay: from there the schedule
  # holds the new peak and weight_decay is the new one (the decay then falls from the
  # last peak). ModernBERT-base: 8e-4, then 3e-4 for its context extension. () none.
  c.train.learning_rate_restarts = ()
  c.train.warmup_steps = 10_000  # Linear warm-up from 0 to the peak.
  # After the warm-up: 'linear' decays linearly to 0 at num_steps (BERT); 'wsd'
  # (warm-up-stable-decay, ModernBERT) holds the peak, then decays over the last
  # decay_fraction of the steps to learning_rate * final_lr_fraction.
  c.train.schedule = "linear"
  # linear: where the decay starts, 'step0' (BERT's TF code: measured from step 0, so
  # it resumes below the peak at the end of warm-up) or 'warmup_end' (from the peak).
  c.train.decay_start = "step0"
  c.train.decay_fraction = 0.1  # wsd: share of num_steps in the final decay (0: none).
  c.train.decay_shape = "1-sqrt"  # wsd: '1-sqrt' (Haegele et al. 2024) or 'linear'.
  c.train.final_lr_fraction = 0.0  # wsd: the decay ends at learning_rate * this.
  c.train.weight_decay = 0.01  # Decoupled; not on LayerNorm parameters or biases.
  # False: each step decays by lr_t * weight_decay (AdamW in optax and PyTorch). True:
  # by (lr_t / learning_rate) * weight_decay, optimi's decouple_lr and Composer's
  # DecoupledAdamW ("fully decoupled"; ModernBERT's weight_decay 1e-5 is of this kind).
  c.train.decouple_lr = False
  c.train.b1 = 0.9  # Adam beta1.
  c.train.b2 = 0.999  # Adam beta2.
  c.train.eps = 1e-6  # Adam epsilon (BERT's value).
  c.train.max_grad_norm = 1.0  # Global-norm clipping; 0 disables.
  c.train.log_every = 100  # Steps between metric logs (the only host syncs).
  c.train.eval_every = 10_000  # Steps between evaluations (every one of config.evals).
  c.train.eval_batches = 50  # Held-out batches per evaluation and source (0: all).
  c.train.checkpoint_every = 10_000  # Steps between checkpoints.
  c.train.max_to_keep = 3  # Checkpoints kept in the workdir.
  # Skip the update (parameters and optimizer state, its step count included, stay as
  # they were) of a step whose loss or gradient norm is non-finite or exceeds the mean
  # + spike_sigma * std of the last spike_window accepted steps (only non-finite ones
  # until that many were accepted); counted as the metric skipped_steps. False: a
  # non-finite loss stops the run naming the last good checkpoint.
  c.train.skip_step_on_spikes = False
  c.train.spike_window = 100  # Accepted steps in the rolling statistics.
  c.train.spike_sigma = 6.0  # k: a loss above mean + k * std is a spike.
  # (first, last): a jax.profiler trace of steps first..last into WORKDIR/tensorboard
  # (TensorBoard's profile tab; process 0); () traces nothing.
  c.train.profile_steps = ()
  # The PRNG implementation of the train step's dropout key: '' (threefry2x32, JAX's
  # default), 'rbg' or 'unsafe_rbg' (XLA's RngBitGenerator: cheaper masks on a GPU; other
  # masks for a seed, parameters' initialisation unchanged). See docs/gpu/2026-11-28-trace.md.
  # RTD's generator samples are threefry's whatever it is (a key a row: train/step.py
  # `row_keys`).
  c.train.prng_impl = ""

  # Evaluations by name (bertjax/train/evaluators.py), each logged as NAME/metric.
  # 'held_out': the held-out documents (each source too, NAME/SOURCE/...) scored by
  # every objective (MLM's accuracy beside the most-frequent-token baseline, NSP's,
  # SBO's) at the current length phase's length and inputs (rope theta): the model
  # being trained.
  c.evals = ml_collections.ConfigDict()
  c.evals.eval = ml_collections.ConfigDict()
  c.evals.eval.type = "held_out"  # A kind of evaluation: 'held_out'.
  # True: during an earlier length phase, also at the final phase's, logged as
  # eval_final/... (the curve of the model the run ends with).
  c.evals.eval.final_length = False
  # Every evaluation: True also evaluates the weights a new run starts from (logged at
  # step 0): the baseline of continued pretraining (config.init_from).
  c.evals.eval.at_start = False

  c.checkpoint = ml_collections.ConfigDict()
  # A checkpoint that cannot be restored: 'error' stops naming its step; 'previous'
  # moves it to WORKDIR/corrupt_checkpoints/ (kept, never deleted) and resumes from the
  # step before. Either way a workdir whose checkpoints all fail never restarts at 0.
  c.checkpoint.on_corrupt = "error"

  c.distributed = ml_collections.ConfigDict()  # Multi-process jobs only.
  c.distributed.initialization_timeout_s = 300  # Wait for every process to join.
  # A process silent this long (killed, host lost) ends every other process with an
  # error naming it, rather than leaving them blocked in a collective forever.
  c.distributed.heartbeat_timeout_s = 100

  c.mesh = ml_collections.ConfigDict()
  c.mesh.data = -1  # Data-parallel size; -1 fills the devices left over.
  c.mesh.fsdp = 1  # Parameter / optimizer-state sharding size.
  c.mesh.tensor = 1  # Tensor-parallel size (heads, MLP, vocabulary).
  # Multi-slice TPU / multi-node GPU: each axis is split further across slices (DCN);
  # the sizes above are then per slice. E.g. 2 v5e-256 slices: dcn_data=2.
  c.mesh.dcn_data = 1  # Slices the batch is split across.
  c.mesh.dcn_fsdp = 1  # Slices the parameters are sharded across (rarely > 1).
  c.mesh.dcn_tensor = 1  # Keep 1: tensor parallelism needs the fast in-slice network.
  c.logical_axis_rules = LOGICAL_AXIS_RULES  # See the table above.
  return c
