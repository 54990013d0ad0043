"""The Apache Kafka backend: :class:`KafkaLog` (see :mod:`kafkakv.log.kafka.log`)."""

from kafkakv.log.kafka.log import DEFAULT_TRANSACTION_TIMEOUT_MS, KafkaLog, KafkaLogWriter
from kafkakv.log.kafka.settings import parse_kafka_url

__all__ = ["DEFAULT_TRANSACTION_TIMEOUT_MS", "KafkaLog", "KafkaLogWriter", "parse_kafka_url"]
