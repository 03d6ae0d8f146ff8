"""What every step model shares: tensor specs, typed parameters, requests, errors, the Triton adapter."""
