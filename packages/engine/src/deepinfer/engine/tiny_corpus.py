"""A few kilobytes of plain English used to train the tiny checkpoint's byte-level BPE tokenizer.

Written for this project. It mixes narrative, dialogue, instructions, numbers, punctuation and a little
code so that the learned merges cover the kinds of text people type into a demo prompt.
"""

from __future__ import annotations

CORPUS = """\
The morning was cold and clear. Anna opened the window, looked at the hills, and decided to walk to the
village before breakfast. The road was quiet. A few birds were singing in the trees, and the river ran
fast after the rain of the night before. She counted the bridges as she went: one, two, three, four.
At the bakery the owner smiled and asked, "The usual bread, or something new today?" Anna laughed and
said that she would try the new one, a dark loaf with seeds and honey. It was still warm when she
carried it home.

Once upon a time there was a small robot who wanted to learn how to paint. Every day it watched the
painter in the old house by the sea. The painter mixed blue and yellow to make green, and red and white
to make pink. The robot tried too, but its first pictures were only grey. "Why are my colours so sad?"
it asked. The painter answered, "Because you are afraid to make mistakes. Paint the sky the way you
feel it, not the way you think it should be." The next morning the robot painted a sky full of orange
clouds, and the painter said it was the most honest picture in the whole town.

How to make a simple cup of tea:
1. Boil fresh water in a kettle.
2. Warm the pot with a little hot water, then pour it away.
3. Put one spoon of tea leaves for each person into the pot.
4. Pour the boiling water over the leaves and wait three to five minutes.
5. Pour the tea through a strainer into the cups. Add milk, sugar or lemon if you like.

Question: What is the capital of France?
Answer: The capital of France is Paris.
Question: How many days are there in a week?
Answer: There are seven days in a week: Monday, Tuesday, Wednesday, Thursday, Friday, Saturday and Sunday.
Question: What is two plus three?
Answer: Two plus three is five.
Question: Why is the sky blue?
Answer: Sunlight is scattered by the air, and blue light is scattered more than red light, so the sky
looks blue during the day.

The year has twelve months: January, February, March, April, May, June, July, August, September,
October, November and December. Spring brings flowers, summer brings long evenings, autumn brings
falling leaves, and winter brings snow to the mountains. Numbers such as 10, 25, 100, 2024 and 3.14
appear in many texts, and so do times like 9:30 and dates like 12 March.

User: Hello! Can you help me write a short poem about the ocean?
Assistant: Of course. Here is a short poem:
The ocean breathes in silver light,
it sings to the moon all through the night.
The waves come home, the waves go free,
and every shell remembers the sea.
User: Thank you, that is lovely.
Assistant: You are welcome! Let me know if you would like another one.

A good program is easy to read. Give each function one job and a clear name. For example:

def add(a, b):
    return a + b

print(add(2, 3))

The function add takes two numbers and returns their sum. When we call it with 2 and 3, the program
prints 5. Tests check that the answer is right, and comments explain why the code does what it does.

Science is a way of asking questions about the world and checking the answers carefully. A scientist
makes an observation, forms an idea, and designs an experiment to test it. If the results agree with
the idea, the idea becomes stronger; if they do not, the scientist changes the idea and tries again.
Water boils at one hundred degrees Celsius at sea level, and it freezes at zero degrees. Light travels
very fast, about three hundred thousand kilometres every second. The Earth turns once a day and goes
around the Sun once a year.

The market was busy on Saturday. People were buying apples, oranges, potatoes, carrots, fish, cheese
and fresh flowers. A man was playing the guitar near the fountain, and children were dancing around
him. An old woman sold wooden toys that her husband had made during the winter. "Each one is
different," she said, "just like the children who play with them."

Dear friend, thank you for your letter. I am happy to hear that your new job is going well and that
you like the city. Here the weather has been warm, and the garden is full of tomatoes and beans. We
hope you can visit us in the summer. Please write again soon. With best wishes, Thomas.

It is important to sleep well, to drink enough water, and to move your body every day. A short walk
after lunch can clear the mind. Reading a book before bed helps many people rest. Friends, music and
good food make life brighter, and kindness costs nothing at all.

The train left the station at seven o'clock. Through the window we saw fields, farms, small towns and
long rows of trees. A boy across the aisle was reading a book about dragons, and his sister was
drawing a map of an island that does not exist. When the train stopped in the city, everyone stood up
at once, and the quiet journey turned into a crowd of voices, bags and footsteps.
"""
