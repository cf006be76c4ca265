"""What each rank of the host-only tests runs (in its own process; see _ranks.run_ranks)."""

from __future__ import annotations

from typing import Any, Dict

import mscclpp


def bootstrap_rank(rank: int, nranks: int, address: str = "", unique_id: Any = None) -> Dict[str, Any]:
    """Joins by address or id, then exercises the bootstrap; returns what it saw, for the parent to check."""
    kwargs: Dict[str, Any] = {"address": address} if address else {"unique_id": unique_id}
    with mscclpp.Communicator(nranks, rank, **kwargs) as comm:
        seen: Dict[str, Any] = {"rank": comm.rank, "size": comm.size}
        # Lengths differ by rank (rank r sends r+1 copies of its byte), including an empty contribution.
        seen["gathered"] = comm.all_gather(bytes([rank]) * (rank + 1))
        seen["empty"] = comm.all_gather(b"")
        seen["objects"] = comm.all_gather_object({"rank": rank, "name": f"r{rank}"})
        for _ in range(3):
            comm.barrier()
        # A bad call on one rank fails there alone, with the library's line, and the job goes on.
        try:
            comm.connect(nranks + 7, 0, (0x1000, 64))
        except mscclpp.InvalidArgumentError as e:
            seen["bad_connect"] = str(e)
        comm.barrier()
    return seen


def leave_open(rank: int, nranks: int, address: str) -> str:
    """Joins and returns without closing: the package must close it at exit, without hanging."""
    comm = mscclpp.Communicator(nranks, rank, address=address)
    comm.barrier()
    globals().setdefault("_kept", []).append(comm)
    return repr(comm)
