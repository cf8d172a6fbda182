"""The plan: stacks, images and baked images, and the candidates a run may launch."""
