  const uint32_t mg_tid = threadIdx.x;
  const uint32_t mg_nthreads = blockDim.x;
  const uint32_t mg_gid_x = blockIdx.x;
  const uint32_t mg_gid_y = blockIdx.y;
  const uint32_t mg_global_x = blockIdx.x * blockDim.x + threadIdx.x;
  const uint32_t mg_lane = threadIdx.x & 31u;
  const uint32_t mg_warp_id = threadIdx.x >> 5;
  (void)mg_tid; (void)mg_nthreads; (void)mg_gid_x; (void)mg_gid_y; (void)mg_global_x;
  (void)mg_lane; (void)mg_warp_id;
