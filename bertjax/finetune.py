"""Fine-tuning entry point:

  python -m bertjax.finetune --config=configs/finetune/glue.py:sst2 --workdir=DIR \
      --config.init_from=PRETRAINED --config.data.train=train.tsv --config.data.dev=dev.tsv

Any config field can be overridden; `--config.sweep.learning_rates='(5e-5,3e-5)'
--config.sweep.seeds='(0,1,2)'` runs the paper's grid and reports the best dev run.
Rerunning the same command resumes.
"""

import sys

from absl import app, logging

# The pretraining entry point's --config / --workdir flags and its one-line errors.
from bertjax import main as main_lib
from bertjax.errors import BertjaxError


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  main_lib._quiet_libraries()
  from bertjax.tasks import sweep  # After flag parsing: keeps --help fast.
  try:
    result = sweep.run(main_lib._CONFIG.value, main_lib._WORKDIR.value)
  except BertjaxError as e:
    logging.flush()
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  best = result["best"]
  print(f"best dev: learning rate {best['learning_rate']:g}, seed {best['seed']}: "
        + ", ".join(f"{k} {v:.4f}" for k, v in best["dev"].items()))


if __name__ == "__main__":
  app.run(main, flags_parser=main_lib._parse_flags)
