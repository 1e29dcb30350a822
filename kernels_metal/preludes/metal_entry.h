  const uint32_t mg_tid = thread_position_in_threadgroup.x;
  const uint32_t mg_nthreads = threads_per_threadgroup.x;
  const uint32_t mg_gid_x = threadgroup_position_in_grid.x;
  const uint32_t mg_gid_y = threadgroup_position_in_grid.y;
  const uint32_t mg_global_x = thread_position_in_grid.x;
  const uint32_t mg_lane = thread_index_in_simdgroup;
  const uint32_t mg_warp_id = simdgroup_index_in_threadgroup;
  (void)mg_tid; (void)mg_nthreads; (void)mg_gid_x; (void)mg_gid_y; (void)mg_global_x;
  (void)mg_lane; (void)mg_warp_id;
