"""An allreduce across every rank of an MPI job (the MPI image's test program, docs/real-nodes.md).

Each rank contributes rank+1; after MPI_Allreduce(SUM) every rank holds size*(size+1)/2. Each
rank prints one line with its host, what it got and whether that is right; rank 0 prints the
verdict. Exits 1 when any rank got a wrong sum.
"""

from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
total = comm.allreduce(rank + 1, op=MPI.SUM)
want = size * (size + 1) // 2
print(f"rank {rank} of {size} on {MPI.Get_processor_name()}: allreduce sum {total} "
      f"(expected {want})", flush=True)
wrong = comm.allreduce(0 if total == want else 1, op=MPI.SUM)
if rank == 0:
    print(f"allreduce {'OK' if wrong == 0 else 'WRONG'}: {size} ranks, sum {total}", flush=True)
raise SystemExit(1 if wrong else 0)
