"""Starting recipes and putting the box back: one file per concern, imports pointing down only.

    base              Server, StartError, the readiness wait (below everything here; the cache and the
                      teardown shield are sparkgate.proc's, below the whole library)
    container_spec    a recipe as a container, and a live container's drift from it
    docker_engine     the target's docker engine, reached over ssh
    process_launcher  a recipe as a local process
    docker_launcher   a recipe as a container, every change journaled and undoable
    lifecycle         serving(): refuse, start, wait, and always restore
"""

from .base import CouldNotRun, NeedsTakeOver, Occupied, Server, StartError
from .lifecycle import serving

__all__ = ["CouldNotRun", "NeedsTakeOver", "Occupied", "Server", "StartError", "serving"]
