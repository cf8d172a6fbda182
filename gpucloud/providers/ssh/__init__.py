"""The ssh provider: machines of the user's own, reached over OpenSSH."""
