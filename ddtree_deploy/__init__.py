"""ddtree-deploy: ship DDTree speculative decoding onto installed SGLang as overlay releases.

Data flows one way: inventory → transport → facts/snapshot → patch set → overlay → release → server → probe.
The CLI imports no torch at start-up; kernels live in ``patches/ddtree/runtime`` and travel inside overlays.
"""

__version__ = "0.1.0"
