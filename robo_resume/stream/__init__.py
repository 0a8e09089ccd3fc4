"""The stream layer: how a dataset's frames flow from the files to the training loop.

:mod:`.tuning` (the knobs), :mod:`.blocks` (blocks of frames and the batch buffers they are
decoded into), :mod:`.group_read` (one group's chunks read block by block), :mod:`.reading`
(a dataset's stream, group by group, into batches), :mod:`.loader` (the DataLoader over whole
batches and its epoch loop), :mod:`.startup` (worker processes, ranks), :mod:`.shared_arrays`
(the dataset's large arrays, mapped by spawn and forkserver workers instead of copied).
:class:`robo_resume.dataset.ChunkedEpisodeDataset` drives them.
"""
