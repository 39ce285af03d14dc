"""Trust: signing, trust domains, KV verification, sealing, minimization and noise.

=================  ==========================================================
module             what it does
=================  ==========================================================
``keys``           Ed25519 signing keys, domain seal keys, the 0600 keyring
``signing``        ``sign`` / ``verify_signature`` / byte-exact ``load_signed``
``verify``         does the KV encode its claimed tokens? (sample / strict); what a slice
                   is verified against (``slice_context``)
``probe``          re-computes K/V at chosen positions with the receiver's model
``verify_policy``  ``VerifyPolicy`` per domain and handoff; ``check_received`` = all of it
``seal``           AES-256-GCM envelopes bound to a domain
``isolation``      cross-domain handoffs degrade to text; exportable ranges only
``noise``          calibrated Gaussian noise on exported K/V
=================  ==========================================================
"""

from c2c.trust.isolation import IsolationDecision, domain_rule, exportable_ranges, minimize, recompute_clean
from c2c.trust.keys import Keyring, PublicKey, SealKey, SigningKey
from c2c.trust.noise import NoiseConfig, add_noise
from c2c.trust.verify_policy import TrustReport, VerifyPolicy, check_received, policy_for
from c2c.trust.seal import open_sealed, seal
from c2c.trust.signing import SignerInfo, load_signed, sign, verify_signature
from c2c.trust.verify import VerifyReport, slice_context, verify_kv

__all__ = [
    "IsolationDecision", "Keyring", "NoiseConfig", "PublicKey", "SealKey", "SignerInfo", "SigningKey",
    "TrustReport", "VerifyPolicy", "VerifyReport", "add_noise", "check_received", "domain_rule", "exportable_ranges",
    "load_signed", "minimize", "open_sealed", "policy_for", "recompute_clean", "seal", "sign",
    "slice_context", "verify_kv", "verify_signature",
]
