"""The files of a run's workdir, named in this one place.

A pretraining workdir (`python -m bertjax.main --workdir=DIR`) holds:
  run.json               whose run the workdir is (`bertjax.writes`: kind and task)
  config.json            the run's config (on resume only `workdir.RESUMABLE` may change)
  tokenizer/             the tokenizer (`Tokenizer.save`)
  init_from.json         a run continued from a checkpoint (`config.init_from`): where
                         from, its model and vocabulary (`bertjax.train.continued`)
  checkpoints/N/         orbax step N: `state` (the train state) and `data` (the
                         data-iterator position)
  corrupt_checkpoints/N  steps moved aside by `config.checkpoint.on_corrupt=previous`
  metrics.jsonl          one JSON line per logged step and split (process 0)
  tensorboard/           TensorBoard events, and `jax.profiler` traces of
                         `config.train.profile_steps`
  training.png           the curves of metrics.jsonl (`bertjax.train.curves`)
  process_I.log          launch/local.sh's log of process I (written before the run)
A fine-tuning workdir (`python -m bertjax.finetune`) holds the same, and:
  task.json              the task's name, labels and step count
  dev_results.json       the dev metrics at the end of training
  dev_predictions.json   one dev prediction per example
  predictions.jsonl      `python -m bertjax.predict`'s output (default location)
  sweep_results.json/.md a sweep's table (its runs in lr{LR}_seed{SEED}/)
"""

import re

CONFIG_FILE = "config.json"
TOKENIZER_DIR = "tokenizer"
INIT_FROM_FILE = "init_from.json"
CHECKPOINT_DIR = "checkpoints"
CORRUPT_DIR = "corrupt_checkpoints"
METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"
PLOT_FILE = "training.png"
TASK_FILE = "task.json"
DEV_RESULTS_FILE = "dev_results.json"
DEV_PREDICTIONS_FILE = "dev_predictions.json"
PREDICTIONS_FILE = "predictions.jsonl"
SWEEP_RESULTS_FILE = "sweep_results.json"
SWEEP_TABLE_FILE = "sweep_results.md"
LAUNCH_LOG = re.compile(r"process_\d+\.log")  # launch/local.sh's, one a process
