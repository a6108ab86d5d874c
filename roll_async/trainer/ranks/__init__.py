"""The fsdp2 trainer on Ray: one actor per rank in one placement group, driven as one Trainer."""
