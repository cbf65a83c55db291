"""The model substrate: loading (names, LoRA, 4-bit), meta-device materialisation, FSDP2 sharding, per-token
log-probs and the shared-prompt forward, and the ``Policy`` that owns them all. Knows nothing of GRPO's math."""
