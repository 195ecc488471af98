A beekeeper in the hill village of Lowmoor has counted more hives this spring than in any year since she began keeping records.

Mara Lind, 64, keeps her records in a green notebook. She said the mild winter helped the colonies.


Neighbours have started planting clover along the lanes to feed the bees.

@highlight

Lowmoor beekeeper counts a record number of hives this spring!

@highlight

She credits the mild winter, and neighbours plant clover for the bees.
