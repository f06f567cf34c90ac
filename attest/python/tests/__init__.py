import logging

# Refusals are logged at WARNING on purpose; keep the test output readable
# (assertLogs still sees them).
logging.getLogger("idemgate_attest").addHandler(logging.NullHandler())
logging.getLogger("idemgate_attest").propagate = False
