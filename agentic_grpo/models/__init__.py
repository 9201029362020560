"""Device-side policy: transformer, KV-cache sampler, tokenizers, checkpoint import."""
