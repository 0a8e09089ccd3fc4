"""``robo-resume audit OUTPUT_DIR``: prove from a ``robo-resume train`` run's checkpoint that
every frame of every epoch it trained was trained exactly once (:mod:`robo_resume.lerobot_train.
audit`)."""

from __future__ import annotations

import argparse
import os

from .common import FAILED, OK, emit


def cmd_audit(args: argparse.Namespace) -> int:
    """Audit the run; exit 0 when exactly once holds, 1 when a frame was replayed or lost."""
    from ..lerobot_train.audit import audit_run, format_audit
    from ..lerobot_train.options import INDEX_LOG_ENV

    index_log = args.index_log or os.environ.get(INDEX_LOG_ENV) or None
    result = audit_run(args.output_dir, checkpoint=args.checkpoint, index_log=index_log)
    emit(args, result.to_dict(), format_audit(result))
    return OK if result.ok else FAILED
