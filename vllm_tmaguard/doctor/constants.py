"""What the doctor's modules and its child processes agree on."""

SCHEMA = "tmaguard.doctor/2"  # the report's JSON schema (docs/doctor.md)
RESULT_TAG = "TMAGUARD-DOCTOR "  # starts the line a child process prints its JSON on
