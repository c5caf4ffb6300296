"""Programs that build an `LLM` and drive it: prepare, doctor, calibrate, profile, tune, the labs, the capstone."""
