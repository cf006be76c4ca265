// Every device function the collectives' entry points call. The entry points themselves, one per kernel,
// reduction operator and element type (`mscclpp_<kernel>[_<op>_<type>]`), are written by build.rs from the
// table in kernels/variants.rs into one translation unit per element type and one (`moving`) for the
// kernels that only move bytes, each of which includes this file; src/collective/kernels.rs finds them in
// the table of entry points build.rs writes from the same table.
#pragma once

#include "allgather_copy.cuh"
#include "allgather_packet.cuh"
#include "allreduce_packet.cuh"
#include "allreduce_rsag.cuh"
#include "alltoall_copy.cuh"
#include "alltoall_packet.cuh"
#include "broadcast_copy.cuh"
#include "broadcast_packet.cuh"
#include "copy_engine.cuh"
#include "send_recv.cuh"
#include "reducescatter_copy.cuh"
#include "reducescatter_packet.cuh"
#include "scale.cuh"
#include "scatter_copy.cuh"
#include "scatter_packet.cuh"
#include "signal.cuh"
#include "zero_copy.cuh"

// Threads of a collective kernel's block (the entry points' __launch_bounds__).
#define MSCCLPP_COLL_THREADS 1024
