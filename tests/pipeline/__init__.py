"""Tests of kafkakv.pipeline."""
