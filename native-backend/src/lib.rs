//! The CUDA device of allocsim: the same allocator models as the simulation, on real GPU
//! memory. Built without any CUDA toolkit; the driver is loaded at run time.
