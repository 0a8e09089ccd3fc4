"""The stream layer: how a dataset's frames flow from the files to the training loop.

:mod:`.tuning` (the knobs), :mod:`.blocks` (reading blocks of frames into batches inside a
worker), :mod:`.loader` (the DataLoader over whole batches and its epoch loop), :mod:`.startup`
(worker processes, ranks), :mod:`.shared_arrays` (the dataset's large arrays, mapped by spawn
and forkserver workers instead of copied). :class:`robo_resume.dataset.ChunkedEpisodeDataset`
drives them.
"""
