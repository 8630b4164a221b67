"""Names of the environment variables that carry ddpdoctor's settings into rank processes.

Environment variables, not arguments, because they reach every process the user's script starts
(torchrun workers, torch.multiprocessing.spawn children) without touching the script's argv.
"""

EVIDENCE_DIR = "DDPDOCTOR_EVIDENCE_DIR"
FINGERPRINT_EVERY = "DDPDOCTOR_FINGERPRINT_EVERY"
SCRIPT = "DDPDOCTOR_SCRIPT"
HEARTBEAT_S = "DDPDOCTOR_HEARTBEAT_S"
ACTIVE = "DDPDOCTOR_ACTIVE"
AGENT = "DDPDOCTOR_AGENT"
