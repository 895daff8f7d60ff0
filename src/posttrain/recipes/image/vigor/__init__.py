"""VIGOR-his curation (CrossTimeEdit's dataset pipeline, 2026): synthetic city, spatial pairing, screening, change labels, instructions."""
