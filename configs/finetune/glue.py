"""GLUE fine-tuning: `configs/finetune/glue.py:TASK` for the nine GLUE tasks, each with
its official metrics (the first selects the best sweep run). The files are GLUE's TSVs.

  python -m bertjax.finetune --config=configs/finetune/glue.py:sst2 --workdir=/tmp/sst2 \
      --config.init_from=/path/to/bert-base-uncased \
      --config.data.train=glue_data/SST-2/train.tsv --config.data.dev=glue_data/SST-2/dev.tsv
  # or prepared TFDS datasets: --config.data.train=tfds:glue/sst2 (--config.data.dev
  # likewise; MNLI: --config.data.dev=glue_data/MNLI/dev_matched.tsv
  # --config.data.dev_mismatched=glue_data/MNLI/dev_mismatched.tsv, or tfds:glue/mnli
  # for both: validation_matched and validation_mismatched, reported as accuracy and
  # accuracy_mm)
  # The paper's selection: --config.sweep.learning_rates='(5e-5,4e-5,3e-5,2e-5)'
  #                        --config.sweep.seeds='(0,1,2,3,4)'
"""

from configs.finetune import base

# task -> (text_a column, text_b column, label column, header?, labels, metrics)
# CoLA's TSV has no header: columns source, label, original label, sentence.
GLUE = {
    "cola": ("3", "", "1", False, ("0", "1"), ("matthews", "accuracy")),
    "sst2": ("sentence", "", "label", True, ("0", "1"), ("accuracy",)),
    "mrpc": ("#1 String", "#2 String", "Quality", True, ("0", "1"), ("f1", "accuracy")),
    "qqp": ("question1", "question2", "is_duplicate", True, ("0", "1"), ("f1", "accuracy")),
    "stsb": ("sentence1", "sentence2", "score", True, (), ("pearson", "spearman")),
    "mnli": ("sentence1", "sentence2", "gold_label", True,
             ("contradiction", "entailment", "neutral"), ("accuracy",)),
    "qnli": ("question", "sentence", "label", True, ("entailment", "not_entailment"),
             ("accuracy",)),
    "rte": ("sentence1", "sentence2", "label", True, ("entailment", "not_entailment"),
            ("accuracy",)),
    "wnli": ("sentence1", "sentence2", "label", True, ("0", "1"), ("accuracy",)),
}
# task -> (text_a, text_b) features of `tfds:glue/TASK` (its label feature is 'label').
TFDS = {"cola": ("sentence", ""), "sst2": ("sentence", ""), "mrpc": ("sentence1", "sentence2"),
        "qqp": ("question1", "question2"), "stsb": ("sentence1", "sentence2"),
        "mnli": ("premise", "hypothesis"), "qnli": ("question", "sentence"),
        "rte": ("sentence1", "sentence2"), "wnli": ("sentence1", "sentence2")}


def get_config(arg="sst2"):
  if arg not in GLUE:
    raise ValueError(f"configs/finetune/glue.py:{arg}: use one of {sorted(GLUE)}.")
  text_a, text_b, label, header, labels, metrics = GLUE[arg]
  c = base.get_config()
  c.task.name = "classification"
  c.task.glue = arg  # Which GLUE task: names the test-server file (bertjax.predict).
  c.task.text_a = text_a  # Column (field) of the first sentence.
  c.task.text_b = text_b  # Column of the second sentence; '' for single sentences.
  c.task.label = label  # Column of the label (the score for STS-B).
  c.task.header = header  # Whether the TSV starts with a header row.
  # A headerless task's test file that has a header (CoLA's 'index<TAB>sentence'):
  # recognised by this column, which then holds the text.
  c.task.test_text_a = "sentence" if arg == "cola" else ""
  c.task.tfds_fields = (*TFDS[arg], "label")  # text_a, text_b, label of tfds:glue/TASK.
  c.task.labels = labels  # Label names in order; () for regression.
  c.task.regression = arg == "stsb"  # One output, mean squared error.
  c.task.metrics = metrics  # Dev metrics; the first selects the best sweep run.
  # MNLI: data.dev is the matched dev set (dev_matched.tsv), which selects; the
  # mismatched one goes to data.dev_mismatched (configs/finetune/base.py).
  return c
