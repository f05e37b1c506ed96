"""DDTree on SGLang's spec-v2 DFlash worker (``DFlashWorkerV2``, SGLang 0.5.14 and later).

Vendored into an overlay as ``sglang/srt/speculative/ddtree_v2/``; the base's own files only gain small hooks
(the patch series) that call into these modules:

- :mod:`.bases`       what each base's series does: the ``traits:`` of each base's folder, which the build
                      writes beside it as ``bases.json`` (the code and the tests read it).
- :mod:`.backends`    one row per target attention backend: proven / wired-unproven / refused and why, the mask
                      layout it reads, its page sizes (``config`` and ``round`` read it).
- :mod:`.config`      the ``--speculative-ddtree-*`` flags: validation at server-argument resolution, the widths
                      (verify width = budget + 1, draft width = the drafter's block size), what is proven and what
                      is refused by default.
- :mod:`.draft_topk`  per-depth top-k draft log-probs over the target's (TP-sharded) LM head, and the tree build,
                      folded into the draft model's CUDA graph (static buffers, no host sync).
- :mod:`.verify_input` the tree-shaped verify input the target's attention backend and graph runner see.
- :mod:`.sampling`    one target token per tree node (argmax, or an independent draw from the request's law).
- :mod:`.round`       the rest of a decode round after the draft forward: mask, verify, walk, KV commit, drafter
                      context, the result the overlap scheduler consumes; under a budget schedule, which budget a
                      round runs (0: the base's own chain round).
- :mod:`.graph_widths` a verify width (and graph kind) per captured batch size for the target's graph runner.
- :mod:`.draft_schedule` the draft graph's tail per captured size: a tree builder, or the base's greedy head.
- :mod:`.adapt`       online adaptation of a schedule from acceptance counted on the GPU, read without a host sync.
- :mod:`.hybrid`      hybrid GatedDeltaNet targets (the bases with patch 0004, :mod:`.bases`): each GDN layer's TARGET_VERIFY through
                      the runtime's tree kernels, the accepted node's recurrent states committed, start-up checks.

The tree algorithms themselves (top-k, best-first build, ancestor masks, walk, slot order) are the DDTree runtime
vendored beside this package as ``sglang/srt/speculative/ddtree/``; nothing here synchronises with the host.
"""
