"""Every SGLang symbol the KV checksum patch touches, for the pinned version. A test asserts each exists, so an
upgrade that renames or drops one fails loudly instead of silently running unpatched."""

SGLANG_VERSION = "0.5.23"

# "module:attribute.path" looked up on the module (classes, functions, methods, dataclass fields).
SYMBOLS = [
    "sglang.srt.mem_cache.radix_cache:RadixCache",
    "sglang.srt.mem_cache.radix_cache:RadixCache.insert",
    "sglang.srt.mem_cache.radix_cache:RadixCache.match_prefix",
    "sglang.srt.mem_cache.radix_cache:RadixCache.checkpoint",
    "sglang.srt.mem_cache.radix_cache:RadixCache.reset",
    "sglang.srt.mem_cache.radix_cache:RadixCache._split_node",
    "sglang.srt.mem_cache.radix_cache:RadixCache._delete_leaf",
    "sglang.srt.mem_cache.radix_cache:RadixCache._update_leaf_status",
    "sglang.srt.mem_cache.radix_cache:RadixCache.evict",
    "sglang.srt.mem_cache.radix_cache:RadixCache.path_device_indices",
    "sglang.srt.mem_cache.radix_cache:RadixKey.child_key",
    "sglang.srt.mem_cache.radix_cache:TreeNode",
    "sglang.srt.mem_cache.base_prefix_cache:InsertParams",
    "sglang.srt.mem_cache.base_prefix_cache:InsertResult",
    "sglang.srt.mem_cache.base_prefix_cache:MatchPrefixParams",
    "sglang.srt.mem_cache.base_prefix_cache:MatchResult._replace",
    "sglang.srt.mem_cache.cache_init_params:CacheInitParams",
    "sglang.srt.mem_cache.registry:register_radix_cache_backend",
    "sglang.srt.mem_cache.registry:get_radix_cache_factory",
    "sglang.srt.mem_cache.registry:create_tree_cache",
    "sglang.srt.mem_cache.registry:TreeCacheBuildContext",
    "sglang.srt.mem_cache.allocator.base:BaseTokenToKVPoolAllocator.get_kvcache",
    "sglang.srt.mem_cache.allocator.base:BaseTokenToKVPoolAllocator.free_segment",
    "sglang.srt.mem_cache.events:KVCacheEventRecorder.record_remove",
    "sglang.srt.mem_cache.memory_pool:MHATokenToKVPool",
    "sglang.srt.mem_cache.memory_pool:MLATokenToKVPool",
    "sglang.srt.mem_cache.common:match_kv_cache",
    "sglang.srt.mem_cache.common:release_kv_cache",
    "sglang.srt.managers.schedule_batch:Req.set_finish_with_abort",
    "sglang.srt.server_args:ServerArgs.radix_cache_backend",
]

# Fields read or written on instances (checked on real objects built in the tests).
MATCH_RESULT_FIELDS = ["device_prefix_len", "last_device_node", "last_host_node", "best_match_node"]
MATCH_PREFIX_PARAMS_FIELDS = ["key", "req"]
INSTANCE_ATTRS = {
    "RadixCache": ["root_node", "page_size", "token_to_kv_pool_allocator", "evictable_size_", "evictable_leaves",
                   "kv_events"],
    "TreeNode": ["children", "parent", "key", "value", "lock_ref", "id"],
    "MHATokenToKVPool": ["k_buffer", "v_buffer", "start_layer"],
    "MLATokenToKVPool": ["kv_buffer", "start_layer"],
}

# Instance attributes only visible in source: (module, class, "self.<attr> =").
ASSIGNED_IN_SOURCE = [
    ("sglang.srt.model_executor.model_runner", "ModelRunner", "self.forward_stream ="),  # the seal stream
]
