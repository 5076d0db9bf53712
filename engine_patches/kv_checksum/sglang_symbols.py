"""Every SGLang symbol the KV checksum patch touches, for the pinned version. A test asserts each exists, so an
upgrade that renames or drops one fails loudly instead of silently running unpatched."""

SGLANG_VERSION = "0.5.23"

# "module:attribute.path" looked up on the module (classes, functions, methods, dataclass fields).
SYMBOLS = [
    # the tree and how SGLang builds it
    "sglang.srt.mem_cache.registry:register_radix_cache_backend",
    "sglang.srt.mem_cache.registry:get_radix_cache_factory",
    "sglang.srt.mem_cache.registry:create_tree_cache",
    "sglang.srt.mem_cache.registry:create_unified_radix_cache",
    "sglang.srt.mem_cache.registry:TreeCacheBuildContext",
    "sglang.srt.server_args:ServerArgs.radix_cache_backend",
    "sglang.srt.mem_cache.unified_radix_cache:UnifiedRadixCache",
    "sglang.srt.mem_cache.unified_radix_cache:UnifiedRadixCache._match_tree",
    "sglang.srt.mem_cache.unified_radix_cache:UnifiedRadixCache.checkpoint_into_tree",
    "sglang.srt.mem_cache.unified_radix_cache:UnifiedRadixCache.reset",
    "sglang.srt.mem_cache.unified_radix_cache:UnifiedRadixCache.inc_lock_ref",
    "sglang.srt.mem_cache.unified_radix_cache:UnifiedRadixCache.dec_lock_ref",
    "sglang.srt.mem_cache.unified_radix_cache:UnifiedRadixCache.path_device_indices",
    "sglang.srt.mem_cache.unified_radix_cache:UnifiedRadixCache._apply_eviction_result",
    "sglang.srt.mem_cache.unified_radix_cache:UnifiedRadixCache._all_reduce",
    "sglang.srt.mem_cache.unified_radix_cache:UnifiedRadixCache.init_hicache",
    "sglang.srt.mem_cache.unified_radix_cache:UnifiedRadixCache._execute_kv_backup",
    "sglang.srt.mem_cache.unified_radix_cache:UnifiedRadixCache.loading_check",
    "sglang.srt.mem_cache.unified_radix_cache:UnifiedRadixCache.init_load_back",
    "sglang.srt.mem_cache.unified_radix_cache:UnifiedRadixCache.has_free_load_back_slot",
    "sglang.srt.managers.cache_controller:HiCacheController.start_loading",
    "sglang.srt.mem_cache.unified_radix_cache:_OngoingWriteThrough.publish_node_ids",
    "sglang.srt.mem_cache.unified_cache.unified_tree_core_interface:UnifiedTreeCoreInterface.match_full_device_prefix",
    "sglang.srt.mem_cache.unified_cache.unified_tree_core_interface:UnifiedTreeCoreInterface.collect_path_info",
    "sglang.srt.mem_cache.unified_cache.unified_tree_core_interface:UnifiedTreeCoreInterface.drop_subtree_no_host",
    "sglang.srt.mem_cache.unified_cache.unified_tree_core_interface:UnifiedTreeCoreInterface.is_backuped",
    "sglang.srt.mem_cache.unified_cache.unified_tree_core_interface:TreePathNodeInfo",
    "sglang.srt.mem_cache.rust_tree_core.adapter:RustUnifiedTreeCore.match_full_device_prefix",
    "sglang.srt.mem_cache.rust_tree_core.adapter:RustUnifiedTreeCore.collect_path_info",
    "sglang.srt.mem_cache.rust_tree_core.adapter:RustUnifiedTreeCore.drop_subtree_no_host",
    "sglang.srt.mem_cache.radix_cache:RadixKey",
    "sglang.srt.mem_cache.base_prefix_cache:MatchPrefixParams",
    # the scheduler side
    "sglang.srt.managers.schedule_batch:Req.init_next_round_input",
    "sglang.srt.managers.scheduler:Scheduler._get_new_batch_prefill_raw",
    "sglang.srt.managers.scheduler:Scheduler.get_num_allocatable_reqs",
    "sglang.srt.managers.schedule_policy:PrefillAdder.add_one_req",
    "sglang.srt.managers.schedule_policy:AddReqResult.OTHER",
    "sglang.srt.managers.schedule_batch:FINISH_ABORT",
    "sglang.srt.mem_cache.common:match_kv_cache",
    "sglang.srt.mem_cache.common:checkpoint_kv_cache",
    "sglang.srt.mem_cache.common:release_kv_cache",
    "sglang.srt.model_executor.model_runner:ModelRunner.forward",
    "sglang.srt.model_executor.forward_batch_info:ForwardBatch.out_cache_loc",
    "sglang.srt.disaggregation.decode:SchedulerDisaggregationDecodeMixin._verify_kv_checksums",
    "sglang.srt.disaggregation.decode:SchedulerDisaggregationDecodeMixin.get_new_prebuilt_batch",
    "sglang.srt.disaggregation.decode_schedule_batch_mixin:ScheduleBatchDisaggregationDecodeMixin.prepare_for_prebuilt",
    # pools, allocators, HiCache
    "sglang.srt.mem_cache.memory_pool:MHATokenToKVPool",
    "sglang.srt.mem_cache.memory_pool:MLATokenToKVPool",
    "sglang.srt.mem_cache.memory_pool:MHATokenToKVPoolFP4",
    "sglang.srt.mem_cache.memory_pool:MLATokenToKVPoolFP4",
    "sglang.srt.mem_cache.allocator.base:BaseTokenToKVPoolAllocator.get_kvcache",
    "sglang.srt.mem_cache.allocator.paged:PagedTokenToKVPoolAllocator._release_page_ids",
    "sglang.srt.mem_cache.allocator.token:TokenToKVPoolAllocator.free",
    "sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller:HybridCacheController.load",
    "sglang.srt.mem_cache.pool_host.base:HostKVCache.free",
    "sglang.srt.mem_cache.pool_host.mha:MHATokenToKVPoolHost",
    "sglang.srt.mem_cache.pool_host.mla:MLATokenToKVPoolHost",
]

# Fields read on instances (checked on real objects built in the tests).
MATCH_PREFIX_PARAMS_FIELDS = ["key", "req"]
TREE_PATH_NODE_FIELDS = ["node_id", "path_start", "path_end", "full_value_len", "num_children"]
INSTANCE_ATTRS = {
    "UnifiedRadixCache": ["tree_core", "page_size", "req_to_token_pool", "token_to_kv_pool_allocator", "disable",
                          "ongoing_write_through", "ongoing_load_back", "buffer_pipeline", "cache_controller",
                          "enable_storage", "tp_world_size", "pp_size", "session", "_components_tuple"],
    "Req": ["kv", "rid", "extra_key", "cache_salt", "full_untruncated_fill_ids", "to_finish", "finished",
            "origin_input_ids", "output_ids"],
    "ReqKvInfo": ["cache_protected_len", "req_pool_idx"],
    "RadixKey": ["token_ids", "extra_key", "is_bigram", "limit", "cache_salt"],
    "MHATokenToKVPool": ["k_buffer", "v_buffer", "start_layer", "layer_num", "page_size", "kv_cache_layout"],
    "MLATokenToKVPool": ["kv_buffer", "start_layer", "layer_num", "page_size"],
    "MHATokenToKVPoolHost": ["layout", "layer_num", "size", "k_buffer", "v_buffer"],
    "MLATokenToKVPoolHost": ["layout", "layer_num", "size", "kv_buffer"],
}

# Instance attributes only visible in source: (module, class, "self.<attr> =").
ASSIGNED_IN_SOURCE = [
    ("sglang.srt.model_executor.model_runner", "ModelRunner", "self.token_to_kv_pool ="),
    ("sglang.srt.model_executor.model_runner", "ModelRunner", "self.is_draft_worker ="),
    ("sglang.srt.managers.scheduler", "Scheduler", "self.token_to_kv_pool_allocator ="),
    ("sglang.srt.managers.scheduler", "Scheduler", "self.waiting_queue: List[Req] ="),
    ("sglang.srt.disaggregation.decode_schedule_batch_mixin", "ScheduleBatchDisaggregationDecodeMixin",
     "self.out_cache_loc ="),
    ("sglang.srt.mem_cache.memory_pool", "MHATokenToKVPoolFP4", "self.k_scale_buffer ="),
    ("sglang.srt.mem_cache.memory_pool", "MLATokenToKVPoolFP4", "self.kv_scale_buffer ="),
    ("sglang.srt.managers.cache_controller", "HiCacheController", "self.mem_pool_host ="),
]
