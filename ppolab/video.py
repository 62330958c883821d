"""--capture-video where the environment cannot render (envpool): the frames the agent observes, as videos."""

import os

import numpy as np


class VideoRecorder:
    """One environment's observed frames, saved as an mp4 per recorded episode: `<folder>/<name>-<k>.mp4` for
    episodes k = 0, 1, 8, 27, ... (the cubes, as Gymnasium's RecordVideo records). A frame is an RGB image
    (H, W, 3) or a grayscale one (H, W), recorded as RGB."""

    def __init__(self, folder: str, name: str = "episode"):
        self.folder, self.name, self.episode, self.frames = folder, name, 0, []
        os.makedirs(folder, exist_ok=True)

    def add(self, frame: np.ndarray, episode_over: bool):
        """The frame after a step (kept if its episode is recorded; a copy); `episode_over`: the episode ended
        at this step, and its video is written."""
        if round(self.episode ** (1 / 3)) ** 3 == self.episode:
            self.frames.append(np.repeat(frame[:, :, None], 3, axis=2) if frame.ndim == 2 else frame.copy())
        if episode_over:
            if self.frames:
                from moviepy import ImageSequenceClip  # imported only when used

                ImageSequenceClip(self.frames, fps=15).write_videofile(
                    f"{self.folder}/{self.name}-{self.episode}.mp4", logger=None
                )
            self.episode, self.frames = self.episode + 1, []
