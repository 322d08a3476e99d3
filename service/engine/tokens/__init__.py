"""What every decoding task shares: choosing tokens (sampling, constraints), stopping and streaming them."""
