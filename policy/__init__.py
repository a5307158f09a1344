"""The memory policy: observation encoders and the KV-cache causal-transformer actor-critic
(docs/design.md section 11). Depends on ``gpusim.kernels.episode_mask`` only."""

from policy.actor_critic import ActorCritic, PolicyConfig
from policy.encoders import ObsDims, ObsEncoder
from policy.transformer import CausalTransformer, KVCache

__all__ = ["ActorCritic", "PolicyConfig", "ObsDims", "ObsEncoder", "CausalTransformer", "KVCache"]
