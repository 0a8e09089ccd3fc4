"""The index layer: pure arithmetic over episode lengths; no I/O, numpy and the standard library.

- :mod:`.plan` cuts episodes into chunks of contiguous frames.
- :mod:`.schedule` orders the chunks of an epoch into streams (one per worker per rank) and
  turns a number of consumed batches into each stream's position.
- :mod:`.elastic` re-partitions what an interrupted epoch has left over another topology.

Words used with one meaning across the package:

- *stream*: the frames one DataLoader worker of one rank emits in an epoch, in order.
- *position*: how many frames of its stream, in one epoch, a stream has emitted.
- *cursor*: a recorded ``(rank, worker, epoch, position)`` of a stream
  (:class:`robo_resume.state.StreamCursor`).
- *topology*: world size, number of workers, batch size (:class:`.schedule.Topology`).
"""
