"""Fine-tuning entry point:

  python -m bertjax.finetune --config=configs/finetune/glue.py:sst2 --workdir=DIR \
      --config.init_from=PRETRAINED --config.data.train=train.tsv --config.data.dev=dev.tsv

Any config field can be overridden; `--config.sweep.learning_rates='(5e-5,3e-5)'
--config.sweep.seeds='(0,1,2)'` runs the paper's grid and reports the best dev run.
Rerunning the same command resumes. The flags are `python -m bertjax.main`'s
(`bertjax.train.program`: --config, --workdir and the multi-process ones:
--coordinator_address, ...); the run is `bertjax.tasks.sweep`.
"""

from absl import app

from bertjax.console import cli
from bertjax.train import program


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  import jax  # pylint: disable=g-import-not-at-top  (after flag parsing: fast --help)

  from bertjax.tasks import sweep  # pylint: disable=g-import-not-at-top
  program.start()
  config = program.CONFIG.value
  result = sweep.run(config, program.WORKDIR.value)
  best = result["best"]
  if best["dev"] and jax.process_index() == 0:  # {} when preempted
    print(f"best dev: learning rate {best['learning_rate']:g}, seed {best['seed']}: "
          + ", ".join(f"{k} {v:.4f}" for k, v in best["dev"].items()))
    metric = result.get("metric")
    for s in result.get("by_learning_rate", ()):
      if len(s["seeds"]) > 1:
        print(f"learning rate {s['learning_rate']:g} over {len(s['seeds'])} seeds: "
              f"{metric} {s['mean'][metric]:.4f} ± {s['std'][metric]:.4f} "
              f"(min {s['min'][metric]:.4f}, max {s['max'][metric]:.4f})")


if __name__ == "__main__":
  cli.run(main, flags_parser=program.parse_flags)
