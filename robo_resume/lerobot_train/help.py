"""``robo-resume train --help``: robo_resume's own flags and what resumes exactly, printed
before lerobot-train's help."""

from __future__ import annotations

OWN_HELP = """\
robo-resume train: lerobot-train's pipeline (every lerobot-train flag below works as there)
with robo_resume's data path, exact crash resume and these flags of its own, read before
lerobot's parser sees the rest:

robo_resume's data options (--data.*, and --dataset.episodes read first):
  --dataset.episodes=SELECTION  lerobot's [0,1,2], ranges 0-9,12, a slice string train[:90%],
                        or readable (the episodes whose files all exist and open; the list is
                        saved in train_config.json, so a resume uses the same episodes)
  --data.on_error=raise|skip  raise (default): a file check before step 1 refuses missing or
                        unreadable files, naming them; skip: chunks whose files fail are
                        skipped as they are read, each logged, and the run goes on
  --data.features='{"actions": "action", "image": "observation.images.image"}'
                        rename a dataset's keys to lerobot's names (null drops a feature,
                        never opened or decoded); needed when the policy's keys (action,
                        observation.state, observation.images.*) are named otherwise
  --data.resume_strict=true|false  false resumes a checkpoint whose data state was saved for
                        other data or options. RISK: frames are then replayed or lost,
                        silently; each difference is logged as a warning
  A resume keeps --data.on_error and --data.features (and --dataset.episodes, in the
  config); --data.resume_strict applies to the one resume it is given to.

Streaming (nothing downloaded but meta/, cached in $ROBO_RESUME_CACHE/remote):
  --dataset.streaming=true  with --dataset.repo_id=ORG/NAME (no --dataset.root): read
                        hf://datasets/ORG/NAME at --dataset.revision (default main) as byte
                        ranges; HF_ENDPOINT and HF_TOKEN as for huggingface_hub
  --dataset.root=URL    hf://datasets/ORG/NAME[@REV], s3://..., gs://... or https://...
                        streams with or without the flag (credentials: docs/remote.md)
  Workers: spawn (lerobot's default), forkserver or null; fork is refused for a streamed
  dataset. A resume streams again from the checkpoint's config.

Several datasets (--mix.*; give --dataset.repo_id as a name for the run; --mix.roots may be
URLs):
  --mix.roots=A,B / --mix.repo_ids=x/a,y/b  the sources (the policy's features: the first's)
  --mix.weights=1,3     share of the batches per source (default: equal)
  --mix.features='[{"actions": "action"}, {}]'  one feature mapping per source, in --mix.roots
                        order ({} or null: keep its names; null as a value drops a feature)
  A checkpoint keeps the --mix.* values: resume without them.

Stream order (--stream.*, kept by the checkpoint; other values on resume are refused):
  --stream.order=shuffle|interleave  shuffle (default) trains close to lerobot's sampler
  --stream.shuffle_frames=N  frames per shuffle window (default 1024)
  --stream.interleave=N, --stream.interleave_order=spread|rounds|random  the interleave order

What is exact on --resume=true: the data (every frame of an epoch once, in the order of the
uninterrupted run, also with other --num_workers, --batch_size or processes: elastic resume),
the policy, optimizer, scheduler, step and every rank's RNG state (on CPU, bit-identical
weights). A checkpoint of plain lerobot-train resumes with a warning: its data starts anew.

lerobot-train's flags:
"""


def own_help() -> str:
    """The text ``robo-resume train --help`` prints before lerobot's help."""
    return OWN_HELP
