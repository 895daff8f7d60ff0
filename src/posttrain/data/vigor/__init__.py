"""VIGOR-his curation (spec §1): synthetic city, spatial pairing, screening, change labels, instructions."""
